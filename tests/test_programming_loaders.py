"""The loaders under the hardware seam, each against its stand-in on a fake node.

Success must change the fake sysfs so that discovery sees the new function; every failure
must be a LoadFailed naming the step with the kernel's or tool's own message, and say
whether the card was touched.
"""

from __future__ import annotations

import errno
import os
import re
import struct
from pathlib import Path

import pytest

from compat_tests.fake_alveo import DEFAULT_INTERFACE_UUID, add_alveo_card
from compat_tests.fake_fpga_tools import StandInTools, gbs_parts, write_stand_in_tools
from compat_tests.fake_port_pr import FakePortPr
from compat_tests.fake_sysfs import (
    DEFAULT_AFU_ID,
    DEFAULT_INTERFACE_ID,
    FakeNode,
    build_f2_48xlarge,
    build_intel_node,
)
from compat_tests.fpga_images import (
    NLB3_AFU_ID,
    SKX_INTERFACE_ID,
    XCLBIN_UUID,
    XclbinSpec,
    build_gbs,
    build_xclbin,
    write_image,
)
from plugin.discovery.backends import make_backend
from plugin.programming.ids import dashed
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.aws import AwsFpgaSdk, parse_slot_state
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.loaders.choose import loaders
from plugin.programming.loaders.fpgaconf import Fpgaconf, fpgaconf_args
from plugin.programming.loaders.intel_pr import PortPrIoctl, real_ioctl
from plugin.programming.loaders.xbutil import Xbutil
from value_types.devices import Device

NLB3 = NLB3_AFU_ID.replace("-", "")
BITSTREAM = bytes(range(256)) * 16 + b"\x01\x02\x03"  # not a multiple of 4: no padding asked
AGFI = "agfi-0fedcba9876543210"




def scan(node: FakeNode, backend: str) -> dict[str, Device]:
    return {d.id: d for d in make_backend(backend, node.config()).scan()}


@pytest.fixture
def intel(tmp_path: Path) -> FakeNode:
    return build_intel_node(tmp_path / "node")


@pytest.fixture
def library(tmp_path: Path) -> ImageLibrary:
    root = tmp_path / "images"
    write_image(root, "nlb3.gbs", build_gbs(interface_id=dashed(DEFAULT_INTERFACE_ID),
                                            afu_ids=[NLB3_AFU_ID], bitstream=BITSTREAM))
    write_image(root, "skx.gbs", build_gbs(interface_id=SKX_INTERFACE_ID,
                                           afu_ids=[NLB3_AFU_ID], bitstream=BITSTREAM))
    write_image(root, "f.xclbin", build_xclbin(XclbinSpec(
        interface_uuid=dashed(DEFAULT_INTERFACE_UUID))))
    write_image(root, "other-shell.xclbin", build_xclbin())
    return ImageLibrary(root)


def job(device: Device, library: ImageLibrary | None, image: str | None,
        function_id: str = NLB3, timeout: float = 20.0) -> LoadJob:
    return LoadJob(device=device, function_id=function_id, library=library, image=image,
                   timeout=timeout)


# The port-PR ioctl ---------------------------------------------------------------------------

@pytest.mark.parametrize(("device_id", "request_number", "argsz", "port_id"), [
    ("0000:3b:00.0-port1", 0xB680, 24, 1),  # DFL, the second port of a two-port card
    ("0000:5e:00.0", 0xB580, 32, 0),  # OPAE intel-fpga
])
async def test_ioctl_loads_the_raw_bitstream_and_discovery_sees_the_afu(
        intel, library, device_id, request_number, argsz, port_id):
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()])
    device = scan(intel, "intel")[device_id]
    assert device.attrs["afu_id"] == DEFAULT_AFU_ID

    await PortPrIoctl(intel.dev_root, ioctl=fake).load(job(device, library, "nlb3.gbs"))

    [call] = fake.calls
    assert call.node == Path(device.attrs["fme_node"]).name
    assert call.request == request_number
    assert call.fields["argsz"] == argsz and call.fields["flags"] == 0
    assert call.fields["port_id"] == port_id
    assert call.fields["buffer_size"] == len(BITSTREAM)
    assert call.payload_matched and call.outcome == "ok"
    assert scan(intel, "intel")[device_id].attrs["afu_id"] == NLB3


async def test_ioctl_argument_bytes_are_the_header_layout(intel, library):
    seen: list[bytes] = []
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()])

    def recording(fd: int, request: int, arg: bytearray) -> int:
        seen.append(bytes(arg))
        return fake(fd, request, arg)

    device = scan(intel, "intel")["0000:d8:00.0"]
    await PortPrIoctl(intel.dev_root, ioctl=recording).load(job(device, library, "nlb3.gbs"))
    [arg] = seen
    assert len(arg) == 24
    assert arg[:16] == struct.pack("<IIII", 24, 0, 0, len(BITSTREAM))
    assert struct.unpack_from("<Q", arg, 16)[0] != 0


async def test_ioctl_refuses_a_gbs_for_another_interface_before_opening_the_node(
        intel, library):
    fake = FakePortPr(intel, [(library.root / "skx.gbs").read_bytes()])
    device = scan(intel, "intel")["0000:d8:00.0"]
    with pytest.raises(LoadFailed) as caught:
        await PortPrIoctl(intel.dev_root, ioctl=fake).load(job(device, library, "skx.gbs"))
    assert caught.value.step == "check image" and not caught.value.touched
    assert "was built for interface 1a422218" in caught.value.detail
    assert fake.calls == []


async def test_ioctl_refuses_an_image_holding_another_afu(intel, library):
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()])
    device = scan(intel, "intel")["0000:d8:00.0"]
    with pytest.raises(LoadFailed) as caught:
        await PortPrIoctl(intel.dev_root, ioctl=fake).load(
            job(device, library, "nlb3.gbs", function_id=DEFAULT_AFU_ID))
    assert not caught.value.touched and "not the requested" in caught.value.detail
    assert fake.calls == []


async def test_ioctl_refuses_an_image_outside_the_library(intel, library, tmp_path):
    device = scan(intel, "intel")["0000:d8:00.0"]
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()])
    with pytest.raises(LoadFailed) as caught:
        await PortPrIoctl(intel.dev_root, ioctl=fake).load(job(device, library, "../node/x.gbs"))
    assert caught.value.step == "check image" and not caught.value.touched
    # A symlink in the library to a good image outside it: refused at the load too, not only
    # by the configuration's name check, and the kernel is never called.
    outside = tmp_path / "elsewhere.gbs"
    outside.write_bytes((library.root / "nlb3.gbs").read_bytes())
    (library.root / "escape.gbs").symlink_to(outside)
    with pytest.raises(LoadFailed, match="outside the image library") as caught:
        await PortPrIoctl(intel.dev_root, ioctl=fake).load(job(device, library, "escape.gbs"))
    assert not caught.value.touched and fake.calls == []


@pytest.mark.parametrize(("code", "words"), [
    (errno.EINVAL, "Invalid argument (errno 22)"),
    (errno.EBUSY, "Device or resource busy (errno 16)"),
    (errno.EIO, "Input/output error (errno 5)"),
])
async def test_ioctl_errno_is_the_failure_and_the_port_keeps_its_afu(intel, library, code,
                                                                    words):
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()], fail_errno=code)
    device = scan(intel, "intel")["0000:d8:00.0"]
    with pytest.raises(LoadFailed) as caught:
        await PortPrIoctl(intel.dev_root, ioctl=fake).load(job(device, library, "nlb3.gbs"))
    assert caught.value.step == "port-PR ioctl" and caught.value.touched
    assert words in caught.value.detail and "dfl-fme" in caught.value.detail
    assert scan(intel, "intel")["0000:d8:00.0"].attrs["afu_id"] != NLB3


async def test_opae_pr_error_bits_are_named(intel, library):
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()],
                      fail_errno=errno.EIO, opae_status=0b10)
    device = scan(intel, "intel")["0000:5e:00.0"]
    with pytest.raises(LoadFailed) as caught:
        await PortPrIoctl(intel.dev_root, ioctl=fake).load(job(device, library, "nlb3.gbs"))
    assert "PR CRC error detected" in caught.value.detail


async def test_a_garbled_afu_id_after_the_load_shows_in_discovery(intel, library):
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()], garble=True)
    device = scan(intel, "intel")["0000:d8:00.0"]
    await PortPrIoctl(intel.dev_root, ioctl=fake).load(job(device, library, "nlb3.gbs"))
    after = scan(intel, "intel")["0000:d8:00.0"]
    assert "afu_id" not in after.attrs and not after.healthy


async def test_missing_fme_node_is_unavailable_and_refused_untouched(intel, library):
    device = scan(intel, "intel")["0000:d8:00.0"]
    intel.delete_fme_node("0000:d8:00.0")
    loader = PortPrIoctl(intel.dev_root, ioctl=FakePortPr(intel))
    assert "does not exist" in (loader.unavailable(device) or "")
    with pytest.raises(LoadFailed) as caught:
        await loader.load(job(device, library, "nlb3.gbs"))
    assert caught.value.step == "open FME node" and not caught.value.touched


def test_virtual_function_ports_and_other_families_are_unavailable(intel, tmp_path):
    loader = PortPrIoctl(intel.dev_root)
    vf = scan(intel, "intel")["0000:be:00.1"]
    assert "virtual function" in (loader.unavailable(vf) or "")
    aws = next(iter(scan(build_f2_48xlarge(tmp_path / "aws"), "aws").values()))
    assert "not an Intel FPGA port" in (loader.unavailable(aws) or "")
    assert loader.unavailable(scan(intel, "intel")["0000:d8:00.0"]) is None


async def test_the_real_ioctl_on_a_file_that_is_no_fme_fails_with_enotty(intel, library):
    device = scan(intel, "intel")["0000:d8:00.0"]
    with pytest.raises(LoadFailed) as caught:
        await PortPrIoctl(intel.dev_root, ioctl=real_ioctl).load(
            job(device, library, "nlb3.gbs"))
    assert caught.value.step == "port-PR ioctl"
    assert f"(errno {errno.ENOTTY})" in caught.value.detail


async def test_the_stand_in_catches_a_wrong_request_number(intel, library):
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()])

    def wrong_magic(fd: int, request: int, arg: bytearray) -> int:
        return fake(fd, request ^ 0x0300, arg)  # OPAE's 0xB5 on a DFL node

    device = scan(intel, "intel")["0000:d8:00.0"]
    with pytest.raises(LoadFailed) as caught:
        await PortPrIoctl(intel.dev_root, ioctl=wrong_magic).load(
            job(device, library, "nlb3.gbs"))
    assert fake.calls[0].outcome == "ENOTTY" and "errno 25" in caught.value.detail


def test_the_stand_in_catches_a_whole_file_payload_and_bad_arguments(intel, library):
    import ctypes
    import os

    data = (library.root / "nlb3.gbs").read_bytes()
    fake = FakePortPr(intel, [data])
    node = intel.dev_root / intel.cards["0000:d8:00.0"].fme.name  # type: ignore[union-attr]
    whole = ctypes.create_string_buffer(data, len(data))
    fd = os.open(node, os.O_RDWR)
    try:
        for fields, code in [((24, 0, 0, len(data), ctypes.addressof(whole)), errno.EIO),
                             ((24, 1, 0, 4, ctypes.addressof(whole)), errno.EINVAL),
                             ((16, 0, 0, 4, ctypes.addressof(whole)), errno.EINVAL),
                             ((24, 0, 7, 4, ctypes.addressof(whole)), errno.EINVAL)]:
            with pytest.raises(OSError) as caught:
                fake(fd, 0xB680, bytearray(struct.pack("<IIIIQ", *fields)))
            assert caught.value.errno == code
        with pytest.raises(OSError) as short:
            fake(fd, 0xB680, bytearray(16))
        assert short.value.errno == errno.EFAULT
    finally:
        os.close(fd)
    assert gbs_parts(data).bitstream == BITSTREAM


# Vendor tools --------------------------------------------------------------------------------

@pytest.fixture
def tools(tmp_path: Path, intel: FakeNode) -> StandInTools:
    return write_stand_in_tools(tmp_path / "tools", intel)


async def test_fpgaconf_loads_port_zero_by_pci_address(intel, library, tools):
    device = scan(intel, "intel")["0000:d8:00.0"]
    await Fpgaconf(tools.fpgaconf).load(job(device, library, "nlb3.gbs"))
    [argv] = tools.invocations("fpgaconf")  # the sealed copy, never the library path
    assert argv[:8] == ["--segment", "0x0000", "--bus", "0xd8", "--device", "0x00",
                        "--function", "0x0"]
    assert argv[8].startswith("/proc/self/fd/")
    assert scan(intel, "intel")["0000:d8:00.0"].attrs["afu_id"] == NLB3


def test_fpgaconf_is_not_offered_other_ports(intel, tools):
    devices = scan(intel, "intel")
    loader = Fpgaconf(tools.fpgaconf)
    assert "port 0 of a card only" in (loader.unavailable(devices["0000:3b:00.0-port1"]) or "")
    assert loader.unavailable(devices["0000:3b:00.0"]) is None


async def test_fpgaconf_failure_quotes_the_tool(intel, library, tmp_path):
    tools = write_stand_in_tools(tmp_path / "failing", intel, fail="PR timeout error detected")
    device = scan(intel, "intel")["0000:d8:00.0"]
    with pytest.raises(LoadFailed) as caught:
        await Fpgaconf(tools.fpgaconf).load(job(device, library, "nlb3.gbs"))
    assert caught.value.step == "fpgaconf" and caught.value.touched
    assert "exited with status 5" in caught.value.detail
    assert "PR timeout error detected" in caught.value.detail
    assert "Error writing bitstream to FPGA" in caught.value.detail


async def test_fpgaconf_timeout_kills_the_tool(intel, library, tmp_path):
    tools = write_stand_in_tools(tmp_path / "slow", intel, delay=30)
    device = scan(intel, "intel")["0000:d8:00.0"]
    with pytest.raises(LoadFailed) as caught:
        await Fpgaconf(tools.fpgaconf).load(job(device, library, "nlb3.gbs", timeout=0.5))
    assert "did not finish within 0.5 s and was killed" in caught.value.detail
    assert caught.value.touched
    group = re.search(r"process group (\d+)", caught.value.detail)
    assert group is not None, caught.value.detail
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left sleeping its 30 s
        os.killpg(int(group[1]), 0)


async def test_a_missing_or_unusable_tool_names_its_flag(intel, library, tmp_path):
    device = scan(intel, "intel")["0000:d8:00.0"]
    missing = tmp_path / "no-such-fpgaconf"
    with pytest.raises(LoadFailed) as caught:
        await Fpgaconf(missing).load(job(device, library, "nlb3.gbs"))
    assert not caught.value.touched
    assert str(missing) in caught.value.detail and "--fpgaconf" in caught.value.detail
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    assert "not executable" in (Fpgaconf(plain).unavailable(device) or "")
    assert "not a regular file" in (Fpgaconf(tmp_path).unavailable(device) or "")


async def test_fpgaconf_refuses_a_wrong_interface_without_running(intel, library, tools):
    device = scan(intel, "intel")["0000:d8:00.0"]
    with pytest.raises(LoadFailed) as caught:
        await Fpgaconf(tools.fpgaconf).load(job(device, library, "skx.gbs"))
    assert not caught.value.touched and tools.invocations() == []


async def test_xbutil_programs_the_user_function(intel, library, tools):
    add_alveo_card(intel, "0000:17:00.1")
    device = scan(intel, "alveo")["0000:17:00.1"]
    xclbin = XCLBIN_UUID.replace("-", "")
    await Xbutil(tools.xbutil).load(job(device, library, "f.xclbin", function_id=xclbin))
    [argv] = tools.invocations("xbutil")
    assert argv[:4] == ["program", "--device", "0000:17:00.1", "--user"]
    assert argv[4].startswith("/proc/self/fd/")
    assert scan(intel, "alveo")["0000:17:00.1"].attrs["xclbin_uuid"] == XCLBIN_UUID


async def test_xbutil_refuses_another_shell_or_uuid_untouched(intel, library, tools):
    add_alveo_card(intel, "0000:17:00.1")
    device = scan(intel, "alveo")["0000:17:00.1"]
    xclbin = XCLBIN_UUID.replace("-", "")
    with pytest.raises(LoadFailed) as other_shell:
        await Xbutil(tools.xbutil).load(
            job(device, library, "other-shell.xclbin", function_id=xclbin))
    assert "was built for interface" in other_shell.value.detail
    with pytest.raises(LoadFailed) as other_uuid:
        await Xbutil(tools.xbutil).load(job(device, library, "f.xclbin", function_id=NLB3))
    assert "not the requested" in other_uuid.value.detail
    assert not other_shell.value.touched and not other_uuid.value.touched
    assert tools.invocations() == []


async def test_xbutil_failure_quotes_the_tool(intel, library, tmp_path):
    tools = write_stand_in_tools(tmp_path / "failing", intel, fail="firewall tripped")
    add_alveo_card(intel, "0000:17:00.1")
    device = scan(intel, "alveo")["0000:17:00.1"]
    with pytest.raises(LoadFailed) as caught:
        await Xbutil(tools.xbutil).load(
            job(device, library, "f.xclbin", function_id=XCLBIN_UUID))
    assert caught.value.step == "xbutil program"
    assert "exited with status 1" in caught.value.detail
    assert "ERROR: Could not program device 0000:17:00.1 : firewall tripped" in (
        caught.value.detail)


@pytest.fixture
def aws(tmp_path: Path) -> tuple[FakeNode, StandInTools]:
    node = build_f2_48xlarge(tmp_path / "aws")
    return node, write_stand_in_tools(tmp_path / "aws-tools", node)


async def test_aws_load_then_describe_reports_the_agfi(aws):
    node, tools = aws
    device = next(d for d in scan(node, "aws").values() if d.attrs["slot"] == "3")
    loader = AwsFpgaSdk(tools.load, tools.describe)
    assert await loader.loaded(device) is None
    await loader.load(job(device, None, None, function_id=AGFI.upper().replace("AGFI", "agfi")))
    assert tools.invocations("fpga-load-local-image") == [["-S", "3", "-I", AGFI, "-H"]]
    assert await loader.loaded(device) == AGFI
    assert tools.invocations("fpga-describe-local-image")[-1] == ["-S", "3", "-H"]
    other = next(d for d in scan(node, "aws").values() if d.attrs["slot"] == "2")
    assert await loader.loaded(other) is None


async def test_aws_refuses_a_non_agfi_and_reports_tool_errors(aws, tmp_path):
    node, tools = aws
    device = next(iter(scan(node, "aws").values()))
    with pytest.raises(LoadFailed) as bad:
        await AwsFpgaSdk(tools.load, tools.describe).load(
            job(device, None, None, function_id="afi-0123"))
    assert not bad.value.touched and tools.invocations() == []
    failing = write_stand_in_tools(tmp_path / "aws-failing", node, fail="afi-load-timeout")
    with pytest.raises(LoadFailed) as caught:
        await AwsFpgaSdk(failing.load, failing.describe).load(
            job(device, None, None, function_id=AGFI))
    assert caught.value.step == "fpga-load-local-image"
    assert "Error: (7) afi-load-timeout" in caught.value.detail
    missing = AwsFpgaSdk(tmp_path / "none", failing.describe)
    assert "--fpga-load-local-image" in (missing.unavailable(device) or "")


def test_slot_state_parser_reads_both_spellings_of_no_afi():
    loaded = parse_slot_state(
        "AFI          0       agfi-0FEDCBA9876543210  loaded            0        ok"
        "               0       0x04261818\n", 0)
    assert loaded is not None and loaded.agfi == AGFI and loaded.status == "loaded"
    readme = parse_slot_state(
        "AFI          0       No AFI                  cleared           1        ok"
        "               0       0x04261818\n", 0)
    assert readme is not None and readme.agfi is None and readme.status == "cleared"
    assert parse_slot_state("AFIDEVICE    0       0x1d0f      0x9048      0000:34:00.0", 0) \
        is None


async def test_stand_in_tools_refuse_what_the_real_ones_refuse(intel, tools, library):
    import asyncio

    async def run(path: Path, *args: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            str(path), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await process.communicate()
        return process.returncode or 0, out.decode()

    gbs = str(library.root / "nlb3.gbs")
    assert await run(tools.fpgaconf, "--bus=0xd8", gbs) == (1, "Invalid cmdline options\n")
    assert await run(tools.fpgaconf, "-B", "0xd8") == (1, "No GBS file\n")
    skx = str(library.root / "skx.gbs")  # built for an interface no card here has
    assert await run(tools.fpgaconf, "0000:5e:00.0", skx) == (4, "No suitable slots found.\n")
    code, out = await run(tools.fpgaconf, gbs)  # every card here has the interface
    assert (code, out) == (5, "Found more than one suitable slot, please be more specific.\n")
    assert await run(tools.fpgaconf, "0000:5e:00.0", gbs) == (0, "")  # positional address
    assert scan(intel, "intel")["0000:5e:00.0"].attrs["afu_id"] == NLB3
    code, out = await run(tools.xbutil, "program", "-p", "x.xclbin")  # the 2019 syntax
    assert code == 1 and "unrecognised option '-p'" in out
    code, out = await run(tools.load, "-S", "0")
    assert code == 234 and "Error: (-22) Invalid argument" in out


def test_fpgaconf_args_use_hex_with_prefix():
    assert fpgaconf_args("0001:08:1f.7", "/i/x.gbs") == [
        "--segment", "0x0001", "--bus", "0x08", "--device", "0x1f", "--function", "0x7",
        "/i/x.gbs"]


def test_loaders_by_family(tmp_path):
    paths = dict(dev_root=tmp_path, fpgaconf=tmp_path / "f", xbutil=tmp_path / "x",
                 aws_load=tmp_path / "l", aws_describe=tmp_path / "d")
    chosen = loaders(intel="ioctl", **paths)
    assert sorted(chosen) == ["alveo", "aws", "intel"]
    assert isinstance(chosen["intel"], PortPrIoctl)
    assert isinstance(loaders(intel="fpgaconf", **paths)["intel"], Fpgaconf)
    with pytest.raises(ValueError, match="--intel-loader"):
        loaders(intel="opae", **paths)
