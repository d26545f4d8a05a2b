"""The kubelet emulator behaves like the kubelet of each version, checked with a fake plugin.

The matrix trusts the emulator to be a faithful kubelet; these tests pin down the kubelet
behaviour it relies on, from the plugin's side of the socket: here registration (versions,
resource names, dial-back) and the directory; the calls after it in ``test_emulator_calls``.
The ``stack`` fixture is in ``compat_tests/conftest.py``.
"""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest

from compat_tests.fake_plugin import FakePlugin
from compat_tests.kubelet import (
    MODELS,
    KubeletEmulator,
)
from compat_tests.kubelet.registration import is_extended_resource_name

RESOURCE = "example.com/fake"


def test_models_map_versions_to_generations():
    assert MODELS["1.8"] == "v1alpha1"
    assert MODELS["1.9"] == "v1alpha2"
    assert {MODELS[m] for m in ("1.10", "1.16", "1.19", "1.26", "1.33")} == {"v1beta1"}
    with pytest.raises(ValueError, match="unknown kubelet model"):
        KubeletEmulator(Path("/tmp"), "1.7")


@pytest.mark.parametrize(
    ("model", "sent", "message"),
    [
        ("1.8", "v1alpha2", "unsupported API version by the Kubelet registry"),
        ("1.9", "0.1", 'requested API version "0.1" is not supported by kubelet. '
                       'Supported version is "v1alpha2"'),
        ("1.10", "v1alpha2", 'requested API version "v1alpha2" is not supported by kubelet. '
                             'Supported version is ["v1beta1"]'),
        ("1.26", "v1", 'requested API version "v1" is not supported by kubelet. '
                       'Supported version is ["v1beta1"]'),
    ],
)
async def test_version_string_is_checked_exactly(stack, sockdir, model, sent, message):
    kubelet = await stack(KubeletEmulator(sockdir, model))
    plugin = await stack(FakePlugin(sockdir, "p.sock", kubelet.generation))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.register(kubelet.socket_path, version=sent)
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert refused.value.details() == message
    assert kubelet.registrations == []
    assert kubelet.register_attempts[-1].error == message

    await plugin.register(kubelet.socket_path)
    assert [r.version for r in kubelet.registrations] == [plugin_version(kubelet.generation)]


def plugin_version(generation):
    return {"v1alpha1": "0.1", "v1alpha2": "v1alpha2", "v1beta1": "v1beta1"}[generation]


@pytest.mark.parametrize(
    ("model", "sent_generation", "service"),
    [
        ("1.26", "v1alpha2", "deviceplugin.Registration"),
        ("1.10", "v1alpha1", "deviceplugin.Registration"),
        ("1.9", "v1beta1", "v1beta1.Registration"),
        ("1.8", "v1beta1", "v1beta1.Registration"),
    ],
)
async def test_other_packages_are_unimplemented(stack, sockdir, model, sent_generation, service):
    kubelet = await stack(KubeletEmulator(sockdir, model))
    plugin = FakePlugin(sockdir, "p.sock", sent_generation)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.register(kubelet.socket_path)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert refused.value.details() == f"unknown service {service}"


async def test_same_package_other_generation_gets_the_version_error(stack, sockdir):
    # 1.8 and 1.9 share deviceplugin.Registration: only the version string tells them apart.
    kubelet = await stack(KubeletEmulator(sockdir, "1.8"))
    plugin = FakePlugin(sockdir, "p.sock", "v1alpha2")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.register(kubelet.socket_path)
    assert refused.value.details() == "unsupported API version by the Kubelet registry"


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("b-com.com/accelerator", True),
        ("intel.com/fpga-arria10.v1", True),
        ("example.com/A_b.c-9", True),
        ("accelerator", False),
        ("kubernetes.io/fpga", False),
        ("fpga.kubernetes.io/arria", False),
        ("example.com/", False),
        ("example.com/-fpga", False),
        ("example.com/fpga_", False),
        ("example.com/" + "a" * 63, True),
        ("example.com/" + "a" * 64, False),
        ("Example.com/fpga", False),
        ("example.com/a/b", False),
        ("/fpga", False),
        ("", False),
    ],
)
def test_resource_name_rules(name, valid):
    assert is_extended_resource_name(name) is valid


@pytest.mark.parametrize(
    ("model", "name", "message"),
    [
        ("1.8", "fpga", "the ResourceName is invalid"),
        ("1.8", "", "invalid Empty ResourceName"),
        ("1.9", "kubernetes.io/fpga", 'the ResourceName "kubernetes.io/fpga" is invalid'),
        ("1.26", "example.com/-x", 'the ResourceName "example.com/-x" is invalid'),
    ],
)
async def test_bad_resource_name_is_refused(stack, sockdir, model, name, message):
    kubelet = await stack(KubeletEmulator(sockdir, model))
    plugin = await stack(FakePlugin(sockdir, "p.sock", kubelet.generation))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.register(kubelet.socket_path, resource_name=name)
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert refused.value.details() == message


async def test_recent_kubelet_dials_back_before_answering(stack, sockdir):
    kubelet = await stack(KubeletEmulator(sockdir, "1.26", dial_timeout=1.0))
    nobody = FakePlugin(sockdir, "absent.sock", "v1beta1")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await nobody.register(kubelet.socket_path)
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert refused.value.details().startswith("failed to dial device plugin")
    assert kubelet.registrations == []
    assert not kubelet.is_connected(RESOURCE)


async def test_recent_kubelet_needs_get_device_plugin_options(stack, sockdir):
    kubelet = await stack(KubeletEmulator(sockdir, "1.26"))
    plugin = await stack(FakePlugin(sockdir, "p.sock", "v1beta1", serve_options=False))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.register(kubelet.socket_path)
    assert refused.value.details().startswith(
        "failed to get device plugin options: rpc error: code = Unimplemented desc = ")
    assert plugin.streams_opened == 0


@pytest.mark.parametrize("model", ["1.8", "1.9", "1.10", "1.25"])
async def test_older_kubelets_answer_first_and_dial_afterwards(stack, sockdir, model):
    kubelet = await stack(KubeletEmulator(sockdir, model, dial_timeout=1.0))
    nobody = FakePlugin(sockdir, "absent.sock", kubelet.generation)
    await nobody.register(kubelet.socket_path)  # accepted although nothing serves
    assert [r.endpoint for r in kubelet.registrations] == ["absent.sock"]
    with pytest.raises(TimeoutError):
        await kubelet.wait_for_devices(RESOURCE, timeout=1.5)


async def test_start_wipes_the_directory_but_the_checkpoint(stack, sockdir):
    plugin_dir = sockdir / "sub"
    plugin_dir.mkdir()
    (sockdir / "kubelet_internal_checkpoint").write_text("{}")
    (sockdir / "notes.txt").write_text("x")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sockdir / "old.sock"))
    stale.close()
    kubelet = await stack(KubeletEmulator(sockdir, "1.26"))
    assert sorted(p.name for p in sockdir.iterdir()) == [
        "kubelet.sock", "kubelet_internal_checkpoint", "sub"]
    assert kubelet.removed_at_start == ["notes.txt", "old.sock"]
    await kubelet.stop()
    assert not kubelet.socket_path.exists()


@pytest.mark.parametrize("shared", ["/", "/tmp", "/tmp/../tmp"])
def test_refuses_to_wipe_a_shared_directory(shared):
    with pytest.raises(ValueError, match="shared directory"):
        KubeletEmulator(Path(shared), "1.26")


async def test_start_creates_a_missing_directory(stack, sockdir):
    kubelet = await stack(KubeletEmulator(sockdir / "new" / "dir", "1.9"))
    assert kubelet.socket_path.is_socket()


async def test_restart_deletes_plugin_sockets(stack, sockdir):
    kubelet = await stack(KubeletEmulator(sockdir, "1.26"))
    plugin = await stack(FakePlugin(sockdir, "p.sock", "v1beta1"))
    await plugin.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE)
    await kubelet.stop()
    assert plugin.socket_path.exists()
    again = await stack(KubeletEmulator(sockdir, "1.26"))
    assert not plugin.socket_path.exists()
    assert "p.sock" in again.removed_at_start
    assert again.devices(RESOURCE) == {}
