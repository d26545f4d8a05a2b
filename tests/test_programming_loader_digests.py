"""Every loader loads exactly the bytes it hashed and checked, or nothing.

A digest the job pins that the image's bytes do not have is refused before the card is
touched (the stand-in ioctl or tool never runs); a library file replaced between the
driver's check and the load is caught by the loader's own hash; and a file replaced after
the loader's check, while a vendor tool is starting, does not reach the card: the tool
reads the sealed copy of the checked bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from compat_tests.fake_alveo import DEFAULT_INTERFACE_UUID, add_alveo_card
from compat_tests.fake_fpga_tools import StandInTools, write_stand_in_tools
from compat_tests.fake_port_pr import FakePortPr
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, FakeNode, build_intel_node
from compat_tests.fpga_images import (
    NLB0_AFU_ID,
    NLB3_AFU_ID,
    XCLBIN_UUID,
    XclbinSpec,
    build_gbs,
    build_xclbin,
    write_image,
)
from plugin.discovery.backends import make_backend
from plugin.programming import digest
from plugin.programming.ids import dashed
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders import tools as tools_module
from plugin.programming.loaders.aws import AwsFpgaSdk
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.loaders.fpgaconf import Fpgaconf
from plugin.programming.loaders.intel_pr import PortPrIoctl
from plugin.programming.loaders.sealed import sealed_copy
from plugin.programming.loaders.xbutil import Xbutil
from value_types.devices import Device

NLB3 = NLB3_AFU_ID.replace("-", "")
BITSTREAM = bytes(range(256)) * 8


def gbs(afu: str, fill: bytes = BITSTREAM) -> bytes:
    return build_gbs(interface_id=dashed(DEFAULT_INTERFACE_ID), afu_ids=[afu], bitstream=fill)


@pytest.fixture
def intel(tmp_path: Path) -> FakeNode:
    return build_intel_node(tmp_path / "node")


@pytest.fixture
def library(tmp_path: Path) -> ImageLibrary:
    root = tmp_path / "images"
    write_image(root, "nlb3.gbs", gbs(NLB3_AFU_ID))
    write_image(root, "f.xclbin", build_xclbin(XclbinSpec(
        interface_uuid=dashed(DEFAULT_INTERFACE_UUID))))
    return ImageLibrary(root)


@pytest.fixture
def tools(tmp_path: Path, intel: FakeNode) -> StandInTools:
    return write_stand_in_tools(tmp_path / "tools", intel)


def port(node: FakeNode, device_id: str = "0000:d8:00.0") -> Device:
    return {d.id: d for d in make_backend("intel", node.config()).scan()}[device_id]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def job(device: Device, library: ImageLibrary, image: str, sha256: str | None,
        function_id: str = NLB3) -> LoadJob:
    return LoadJob(device=device, function_id=function_id, library=library, image=image,
                   timeout=20.0, sha256=sha256)


WRONG = "0" * 64


async def test_ioctl_refuses_a_digest_mismatch_untouched(intel, library):
    before = port(intel).attrs["afu_id"]
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()])
    with pytest.raises(LoadFailed) as caught:
        await PortPrIoctl(intel.dev_root, ioctl=fake).load(
            job(port(intel), library, "nlb3.gbs", WRONG))
    assert caught.value.step == digest.DIGEST_STEP and not caught.value.touched
    assert caught.value.detail == digest.mismatch("nlb3.gbs", WRONG,
                                                  sha(library.root / "nlb3.gbs"))
    assert fake.calls == [] and port(intel).attrs["afu_id"] == before


async def test_ioctl_loads_the_bytes_whose_digest_is_pinned(intel, library):
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()])
    await PortPrIoctl(intel.dev_root, ioctl=fake).load(
        job(port(intel), library, "nlb3.gbs", sha(library.root / "nlb3.gbs")))
    [call] = fake.calls
    assert call.payload_matched and port(intel).attrs["afu_id"] == NLB3


@pytest.mark.parametrize("loader", ["ioctl", "fpgaconf"])
async def test_a_file_replaced_after_the_drivers_check_is_refused_by_the_loaders_hash(
        intel, library, tools, loader):
    """The driver vetted nlb3.gbs and pinned its digest; by the time the loader reads it,
    it holds other bytes that fit the device just as well: the loader's own hash refuses."""
    vetted = sha(library.root / "nlb3.gbs")
    before = port(intel).attrs["afu_id"]
    write_image(library.root, "nlb3.gbs", gbs(NLB3_AFU_ID, fill=b"\xee" * 2048))
    fake = FakePortPr(intel, [(library.root / "nlb3.gbs").read_bytes()])
    chosen = PortPrIoctl(intel.dev_root, ioctl=fake) if loader == "ioctl" \
        else Fpgaconf(tools.fpgaconf)
    with pytest.raises(LoadFailed) as caught:
        await chosen.load(job(port(intel), library, "nlb3.gbs", vetted))
    assert caught.value.step == digest.DIGEST_STEP and not caught.value.touched
    assert vetted in caught.value.detail and sha(library.root / "nlb3.gbs") in \
        caught.value.detail
    assert fake.calls == [] and tools.invocations() == []
    assert port(intel).attrs["afu_id"] == before


async def test_fpgaconf_refuses_a_digest_mismatch_without_running(intel, library, tools):
    with pytest.raises(LoadFailed) as caught:
        await Fpgaconf(tools.fpgaconf).load(job(port(intel), library, "nlb3.gbs", WRONG))
    assert caught.value.step == digest.DIGEST_STEP and not caught.value.touched
    assert "'nlb3.gbs'" in caught.value.detail and WRONG in caught.value.detail
    assert tools.invocations() == []


async def test_xbutil_refuses_a_digest_mismatch_without_running(intel, library, tools):
    add_alveo_card(intel, "0000:17:00.1")
    device = {d.id: d for d in make_backend("alveo", intel.config()).scan()}["0000:17:00.1"]
    with pytest.raises(LoadFailed) as caught:
        await Xbutil(tools.xbutil).load(job(device, library, "f.xclbin", WRONG,
                                            function_id=XCLBIN_UUID.replace("-", "")))
    assert caught.value.step == digest.DIGEST_STEP and not caught.value.touched
    assert tools.invocations() == []
    await Xbutil(tools.xbutil).load(job(device, library, "f.xclbin",
                                        sha(library.root / "f.xclbin"),
                                        function_id=XCLBIN_UUID.replace("-", "")))
    assert len(tools.invocations("xbutil")) == 1


async def test_a_tool_loads_the_checked_bytes_even_if_the_file_is_replaced_as_it_starts(
        intel, library, tools, monkeypatch):
    """The window a path would leave open: the file replaced after the check, before the
    tool reads it. The stand-in fpgaconf loads whatever file it is handed; the port must
    get the AFU of the bytes that were checked, not of the replacement."""
    real_run = tools_module.run_tool_blocking
    replaced = []

    def replace_then_run(*args, **kwargs):
        write_image(library.root, "nlb3.gbs", gbs(NLB0_AFU_ID))
        replaced.append(True)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(tools_module, "run_tool_blocking", replace_then_run)
    await Fpgaconf(tools.fpgaconf).load(job(port(intel), library, "nlb3.gbs", None))
    assert replaced == [True]  # the file was replaced as the tool started
    assert len(tools.invocations("fpgaconf")) == 1
    assert port(intel).attrs["afu_id"] == NLB3


def test_the_sealed_copy_cannot_be_written_or_resized(intel, library):
    import os

    with sealed_copy(job(port(intel), library, "nlb3.gbs", None)) as image:
        assert image.sha256 == sha(library.root / "nlb3.gbs")
        writable = os.open(image.path, os.O_WRONLY)
        try:
            with pytest.raises(PermissionError):
                os.write(writable, b"other bytes")
        finally:
            os.close(writable)
        with pytest.raises(PermissionError):
            os.ftruncate(image.fd, 1)
        with image.stream() as stream:
            assert stream.read() == (library.root / "nlb3.gbs").read_bytes()


async def test_aws_refuses_a_digest_it_cannot_check(tmp_path):
    from compat_tests.fake_sysfs import build_f2_48xlarge

    node = build_f2_48xlarge(tmp_path / "aws")
    stand_ins = write_stand_in_tools(tmp_path / "aws-tools", node)
    device = next(iter(make_backend("aws", node.config()).scan()))
    loader = AwsFpgaSdk(stand_ins.load, stand_ins.describe)
    with pytest.raises(LoadFailed) as caught:
        await loader.load(LoadJob(device, "agfi-0fedcba9876543210", sha256=WRONG))
    assert not caught.value.touched and "cannot be checked" in caught.value.detail
    assert stand_ins.invocations() == []
