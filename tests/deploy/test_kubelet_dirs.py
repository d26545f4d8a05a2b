"""Which kubelet directories the pods mount on a node whose kubelet has another --root-dir.

The kubelet serves device plugins at a fixed path, ``/var/lib/kubelet/device-plugins/``
(``DevicePluginPath`` in ``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go``, which
``KubeletSocket`` and so ``NewManagerImpl`` in ``pkg/kubelet/cm/devicemanager/manager.go``
build on), whatever its ``--root-dir``; its ``plugins_registry``, ``plugins`` and
``pod-resources`` directories follow ``--root-dir``. A pod that mounted the device-plugin
directory from the root dir would register where no kubelet listens.
"""

from __future__ import annotations

from typing import Any

import pytest
from deploy_support import KUSTOMIZATIONS, REPO, container, env, pod_spec
from deploy_support import render as kustomize
from helm_render import of_kind, render

ROOT = "/data/kubelet"
DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"


def host_paths(objects: list[dict[str, Any]]) -> dict[str, str]:
    """Each hostPath volume of the (one) DaemonSet: volume name -> host path."""
    (daemonset,) = of_kind(objects, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    return {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}


def mounts(objects: list[dict[str, Any]]) -> dict[str, str]:
    (daemonset,) = of_kind(objects, "DaemonSet")
    (main,) = daemonset["spec"]["template"]["spec"]["containers"]
    return {m["name"]: m["mountPath"] for m in main["volumeMounts"]}


def variables(objects: list[dict[str, Any]]) -> dict[str, str]:
    (daemonset,) = of_kind(objects, "DaemonSet")
    (main,) = daemonset["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in main["env"]}


@pytest.mark.parametrize("api", ["device-plugin", "auto"])
def test_a_custom_root_dir_moves_every_kubelet_directory_but_the_device_plugins(api):
    objects = render({"kubeletRootDir": ROOT,
                      "config": {"api": api, "registration": "auto"}})
    paths, mounted, env = host_paths(objects), mounts(objects), variables(objects)
    assert paths["device-plugins"] == DEVICE_PLUGINS
    assert mounted["device-plugins"] == DEVICE_PLUGINS
    assert env["ACCELERATOR_DP_DEVICE_PLUGIN_DIR"] == DEVICE_PLUGINS
    assert paths["plugins-registry"] == mounted["plugins-registry"] == f"{ROOT}/plugins_registry"
    assert env["ACCELERATOR_DP_PLUGINS_REGISTRY_DIR"] == f"{ROOT}/plugins_registry"
    if api == "auto":
        state = f"{ROOT}/plugins/accelerator.b-com.com"
        assert paths["dra-state"] == mounted["dra-state"] == state
        assert env["ACCELERATOR_DP_DRA_STATE_DIR"] == state
        assert paths["pod-resources"] == f"{ROOT}/pod-resources"
        assert env["ACCELERATOR_DP_POD_RESOURCES_SOCKET"] == f"{ROOT}/pod-resources/kubelet.sock"


def test_the_device_plugin_directory_is_a_value_of_its_own():
    """For a kubelet built with another DevicePluginPath: the one value moves the volume,
    the mount and the variable together, and nothing else."""
    objects = render({"devicePluginDir": "/opt/kubelet/device-plugins/",
                      "config": {"registration": "auto"}})
    assert host_paths(objects)["device-plugins"] == "/opt/kubelet/device-plugins"
    assert mounts(objects)["device-plugins"] == "/opt/kubelet/device-plugins"
    assert variables(objects)["ACCELERATOR_DP_DEVICE_PLUGIN_DIR"] == \
        "/opt/kubelet/device-plugins"
    assert host_paths(objects)["plugins-registry"] == "/var/lib/kubelet/plugins_registry"


def test_the_schema_refuses_a_relative_device_plugin_directory():
    from helm_render import HelmRefused

    with pytest.raises(HelmRefused, match="devicePluginDir"):
        render({"devicePluginDir": "device-plugins"})


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_kustomization_mounts_the_kubelets_fixed_device_plugin_directory(rendered, name):
    """kustomize has no root-dir value: an overlay for another root changes the registry,
    plugins and pod-resources paths (docs/deploying.md) and must leave this one alone."""
    objects = rendered[name]
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert volumes["device-plugins"]["hostPath"]["path"] == DEVICE_PLUGINS
    mounted = {m["name"]: m["mountPath"] for m in container(objects)["volumeMounts"]}
    assert mounted["device-plugins"] == DEVICE_PLUGINS


def test_the_kustomize_example_for_another_root_moves_all_but_the_device_plugins(kubectl):
    """deploy/examples/kubelet-root-dir: the dra overlay over --root-dir=/data/kubelet."""
    objects = kustomize(kubectl, REPO / "deploy" / "examples" / "kubelet-root-dir")
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod_spec(objects)["volumes"]
               if "hostPath" in v}
    mounted = {m["name"]: m["mountPath"] for m in container(objects)["volumeMounts"]}
    kubelet = {name for name, path in volumes.items() if "kubelet" in path}
    assert kubelet == {"device-plugins", "plugins-registry", "dra-state", "pod-resources"}
    assert volumes["device-plugins"] == DEVICE_PLUGINS
    for name in kubelet - {"device-plugins"}:
        assert volumes[name].startswith(f"{ROOT}/"), (name, volumes[name])
    for name in kubelet:
        assert mounted[name] == volumes[name], f"{name} is mounted at its host path"
    assert len(container(objects)["volumeMounts"]) == len(mounted), "no mount left twice"
    variables = env(objects)
    assert variables["ACCELERATOR_DP_DEVICE_PLUGIN_DIR"] == DEVICE_PLUGINS
    assert variables["ACCELERATOR_DP_PLUGINS_REGISTRY_DIR"] == f"{ROOT}/plugins_registry"
    assert variables["ACCELERATOR_DP_DRA_STATE_DIR"] == volumes["dra-state"]
    assert variables["ACCELERATOR_DP_POD_RESOURCES_SOCKET"] == f"{ROOT}/pod-resources/kubelet.sock"
