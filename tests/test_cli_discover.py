"""``discover`` shows an operator what ``serve`` would advertise, from any sysfs tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compat_tests.fake_sysfs import build_broken_node, build_intel_node
from compat_tests.fpga_images import NLB0_AFU_ID, build_gbs, write_image
from plugin.programming.load_record import LoadRecord, LoadRecords


def discover(node_root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plugin", "discover", "--backend", "auto",
         "--sysfs-root", str(node_root / "sys"), "--dev-root", str(node_root / "dev"), *extra],
        capture_output=True, text=True, timeout=60,
    )


def test_json_lists_every_port_by_pci_address(tmp_path: Path) -> None:
    build_intel_node(tmp_path)
    result = discover(tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    devices = json.loads(result.stdout)
    ids = [d["id"] for d in devices]
    assert ids == ["0000:3b:00.0", "0000:3b:00.0-port1", "0000:5e:00.0", "0000:be:00.1",
                   "0000:be:00.2", "0000:d8:00.0"]
    assert all(d["health"] == "Healthy" for d in devices)


def test_table_shows_unhealthy_ports_and_why(tmp_path: Path) -> None:
    build_broken_node(tmp_path)
    result = discover(tmp_path)
    assert result.returncode == 0, result.stderr
    crashed = next(line for line in result.stdout.splitlines() if "0000:3b:00.0" in line)
    assert "Unhealthy" in crashed and "all f" in crashed
    assert "warning" in result.stderr.lower(), "skipped devices are reported on stderr"


def test_a_node_without_fpga_lists_nothing_and_succeeds(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    (tmp_path / "dev").mkdir()
    result = discover(tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_discover_into_a_pipe_closed_early_stops_quietly(extra) -> None:
    # `discover | head -1`: the reader goes away after one line.
    process = subprocess.Popen(
        [sys.executable, "-m", "plugin", "discover", "--backend", "units",
         "--accel-nbunits", "4000", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.readline()
    process.stdout.close()
    error = process.stderr.read().decode()
    process.wait(timeout=60)
    assert "Traceback" not in error and "BrokenPipeError" not in error, error
    assert process.returncode == 141


def test_the_table_says_how_many_ids_replicas_give_each_resource(tmp_path: Path) -> None:
    build_intel_node(tmp_path)
    result = discover(tmp_path, "--replicas", "b-com.com/accelerator=4")
    assert result.returncode == 0, result.stderr
    assert "b-com.com/accelerator: 6 device(s), each advertised 4 times as <ID>::0..3 " \
           "(24 IDs)" in result.stdout.splitlines()
    unmatched = discover(tmp_path, "--replicas", "example.com/other=2")
    assert "--replicas matches no resource these devices are advertised under" in \
        unmatched.stdout
    # --json stays the device list scripts read, replicas or not.
    as_json = discover(tmp_path, "--json", "--replicas", "*=4")
    assert as_json.stdout == discover(tmp_path, "--json").stdout


def test_the_table_says_how_dra_share_would_publish_each_device(tmp_path: Path) -> None:
    """The driver's own decision, before any claim: a port whose GBS (loaded by the driver,
    as its load record says) declares 6 contexts is shared 6 ways under ``image``; the other
    ports, which the driver did not load, are published whole, and a number shares each."""
    build_intel_node(tmp_path)
    images, state = tmp_path / "images", tmp_path / "state"
    write_image(images, "nlb0.gbs", build_gbs(afu_ids=(NLB0_AFU_ID,), contexts=6))
    record = LoadRecord(NLB0_AFU_ID.replace("-", ""), "f", "nlb0.gbs", None, "default/c", "now")
    LoadRecords(state).loaded("0000:5e:00.0", record)
    where = ("--image-library", str(images), "--dra-state-dir", str(state))
    result = discover(tmp_path, "--dra-share", "intel=image", *where)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "0000:5e:00.0: published shared, 6 contexts (intel=image), while no claim holds " \
           "it whole" in lines
    assert "0000:d8:00.0: published whole (intel=image): the image of the function it holds " \
           "is not one this driver loaded there, or serves one user" in lines
    numbered = discover(tmp_path, "--dra-share", "intel=3", *where).stdout.splitlines()
    assert len([line for line in numbered if ": published shared, 3 contexts (intel=3)" in
                line]) == 6
    nothing = discover(tmp_path, "--dra-share", "alveo=4", *where).stdout
    assert "--dra-share matches no device here" in nothing
    # --json stays the device list scripts read.
    assert discover(tmp_path, "--json", "--dra-share", "intel=3").stdout == \
        discover(tmp_path, "--json").stdout
