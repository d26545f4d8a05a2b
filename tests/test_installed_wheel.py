"""The wheel as a node gets it: built, installed into a venv of its own, and run from there.

The rest of the suite imports the checkout (pytest's ``pythonpath = .``, the dev venv's
editable install), so a package the wheel leaves out goes unnoticed there: a release once
shipped without ``plugin.programming.remote``, and its ``loader`` and ``serve --loader-socket``
died at start-up with ModuleNotFoundError. Here nothing comes from the checkout: the wheel is
built from a copy of what the image builds from (.dockerignore's list), installed ``--no-deps``
into a fresh venv outside the checkout, and every process runs the installed console script
with its working directory outside the checkout too. Third-party packages come from the dev
venv's site-packages, named by a ``.pth`` *line*: that adds the directory to ``sys.path``
without running the ``.pth`` files in it, so the dev venv's editable finder (which points at
the checkout) is never installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import until, wiper
from compat_tests.fake_alveo import build_mixed_node
from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID
from compat_tests.fpga_images import NLB3_AFU_ID, build_gbs, write_image
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.plugin_process import PluginProcess
from compat_tests.test_dra_loader_process import IMAGE
from compat_tests.test_dra_programming_serve import COUNT, DFL_PORT, DRIVER, NODE, function
from plugin.programming.ids import dashed

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ("plugin", "api_versions", "value_types")
NLB3 = NLB3_AFU_ID.replace("-", "")


@dataclass(frozen=True)
class Installed:
    venv: Path
    python: Path
    script: Path
    outside: Path
    """A working directory with nothing of the checkout in it."""

    def env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
            "PYTHONUNBUFFERED": "1"}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), *args], cwd=self.outside, env=self.env(),
                              capture_output=True, text=True, timeout=120, check=False)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.script), *args], cwd=self.outside, env=self.env(),
                              capture_output=True, text=True, timeout=60, check=False)


def _build_context(into: Path) -> Path:
    """What Dockerfile.multistage builds the wheel from: the names .dockerignore lets
    through, without what the build generates or Python caches."""
    names = [line[1:].strip() for line in (REPO / ".dockerignore").read_text().splitlines()
             if line.startswith("!")]
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "_generated")
    into.mkdir()
    for name in names:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=skip)
        else:
            shutil.copy2(source, into / name)
    return into


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    """One build and install for the module, in a directory outside the checkout."""
    top = Path(tempfile.mkdtemp(prefix="wheel-install-"))
    try:
        source = _build_context(top / "src")
        wheels = top / "wheels"
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
             str(wheels), str(source)],
            cwd=top, capture_output=True, text=True, timeout=600, check=False)
        assert built.returncode == 0, built.stderr[-3000:]
        (wheel,) = wheels.glob("k8s_accelerator_devplugin-*.whl")
        venv = top / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                       timeout=120, cwd=top)
        python = venv / "bin" / "python"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
             "--quiet", "--disable-pip-version-check", str(wheel)],
            cwd=top, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=top, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        # A path line only: the dev venv's own .pth files (its editable finder) do not run.
        (Path(site) / "dev-venv-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        outside = top / "elsewhere"
        outside.mkdir()
        yield Installed(venv, python, venv / "bin" / "accelerator-device-plugin", outside)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_the_installed_package_is_the_wheels_not_the_checkouts(installed: Installed) -> None:
    done = installed.run("-c", "import plugin, api_versions, value_types; "
                         "print(plugin.__file__, api_versions.__file__, value_types.__file__)")
    assert done.returncode == 0, done.stderr
    for path in done.stdout.split():
        assert Path(path).is_relative_to(installed.venv), path
    assert not any(Path(p).is_relative_to(REPO) for p in done.stdout.split())


def test_every_module_of_the_installed_packages_imports(installed: Installed) -> None:
    walk = (
        "import importlib, pkgutil, sys\n"
        f"for top in {SHIPPED!r}:\n"
        "    package = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(package.__path__, top + '.',\n"
        "                                      onerror=lambda name: sys.exit(name)):\n"
        "        if not info.name.endswith('.__main__'):  # runs the command line\n"
        "            importlib.import_module(info.name)\n"
        "            print(info.name)\n"
    )
    done = installed.run("-c", walk)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = set(done.stdout.split())
    # Every package of the checkout is among them (the one once left out included).
    for top in SHIPPED:
        for init in (REPO / top).rglob("__init__.py"):
            name = ".".join(init.parent.relative_to(REPO).parts)
            assert name == top or name in imported, name
    assert "plugin.programming.remote" in imported
    assert "api_versions._generated" in imported


@pytest.mark.parametrize("command", ["serve", "loader", "discover"])
def test_each_command_of_the_installed_script_starts(installed: Installed, command: str) -> None:
    done = installed.cli(command, "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage: accelerator-device-plugin " + command)


async def test_a_load_goes_through_the_installed_loader_to_the_installed_serve(
        installed: Installed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader split end to end, both processes from the installed script."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    short = Path(tempfile.mkdtemp(prefix="iw", dir="/tmp"))  # unix sockets: under 108 bytes
    node = build_mixed_node(tmp_path / "node")
    library = tmp_path / "images"
    write_image(library, IMAGE, build_gbs(afu_ids=(NLB3_AFU_ID,),
                                          interface_id=dashed(DEFAULT_INTERFACE_ID)))
    tools = write_stand_in_tools(tmp_path / "tools", node)
    socket = short / "loader" / "l.sock"
    node_flags = ["--backend", "auto", "--sysfs-root", str(node.sysfs_root), "--dev-root",
                  str(node.dev_root), "--image-library", str(library)]
    with (tmp_path / "loader.log").open("ab") as out:
        loader = subprocess.Popen(
            [str(installed.script), "loader", "--log-format", "json", *node_flags,
             "--loader-socket", str(socket), "--intel-loader", "fpgaconf",
             "--fpgaconf", str(tools.fpgaconf), "--loader-allowed-uids", str(os.geteuid())],
            stdout=out, stderr=subprocess.STDOUT, cwd=installed.outside, env=installed.env())
    plugin: PluginProcess | None = None
    try:
        await until(lambda: socket.exists() or loader.poll() is not None, "the loader's socket")
        assert loader.poll() is None, (tmp_path / "loader.log").read_text()[-3000:]
        registry = short / "registry"
        registry.mkdir()
        async with ApiServerEmulator("1.36") as api:
            api.create_node(NODE)
            api.create_namespace("default")
            api.create_device_class(DRIVER, driver=DRIVER)
            kubelet = KubeletEmulator(short, "1.36", plugins_registry=registry,
                                      reconcile_period=0.05,
                                      dra=DraConfig(**FAST_DRA, node_name=NODE,
                                                    wipe_slices=wiper(api)))
            await kubelet.start()
            try:
                plugin = PluginProcess(short, tmp_path, command=[str(installed.script)],
                                       cwd=installed.outside, extra=[
                    "--api", "dra", "--node-name", NODE,
                    "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                    "--plugins-registry-dir", str(registry), "--dra-state-dir",
                    str(short / "state"), "--cdi-spec-dir", str(tmp_path / "cdi"),
                    *node_flags, "--health-interval", "0.1", "--programming", "on",
                    "--intel-loader", "fpgaconf",
                    # Nothing serve could run itself: the load must go through the loader.
                    "--fpgaconf", str(tmp_path / "no-fpgaconf-here"),
                    "--loader-socket", str(socket)]).start()
                dra = kubelet.dra
                assert dra is not None

                def published() -> dict[str, object]:
                    return {d["name"]: next(iter(d.get("attributes", {}).get(
                                "afuID", {"": None}).values()))
                            for s in api.list("resourceslices")
                            for d in s["spec"].get("devices", [])}

                await until(lambda: len(published()) == COUNT or not plugin.alive,
                            "every device published")
                assert plugin.alive, plugin.text()[-3000:]
                await dra.wait_until(lambda: dra.endpoints(DRIVER), 15.0, "driver registered")
                api.create_claim("default", "nlb3", [("fpga", DRIVER)])
                obj = api.set_claim_status("default", "nlb3", {
                    "allocation": objects.allocation(
                        [objects.result("fpga", DRIVER, NODE, DFL_PORT)], node_name=NODE,
                        config=[function(afuID=NLB3_AFU_ID, image=IMAGE)]),
                    "reservedFor": [objects.pod_reference("nlb3-pod", "nlb3-pod-uid")]})
                ref = ClaimRef("default", "nlb3", obj["metadata"]["uid"], (DRIVER,))
                result = (await dra.prepare([ref])).result(ref.uid)
                assert result.ok, f"{result.error}\n{plugin.text()[-3000:]}"
                [argv] = tools.invocations("fpgaconf")  # run once, by the loader
                assert argv[:4] == ["--segment", "0x0000", "--bus", "0xd8"]
                await until(lambda: published()[DFL_PORT] == NLB3, "the new AFU ID published")
                assert "ModuleNotFoundError" not in plugin.text()
            finally:
                if plugin is not None:
                    plugin.kill()
                await kubelet.stop()
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait(10)
        shutil.rmtree(short, ignore_errors=True)
