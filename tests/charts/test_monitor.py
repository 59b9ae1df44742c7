"""The chart's runtime-truth parts (issue 15), rendered by the real helm: the MPS control daemon
with `mps.enabled`, and what the usage monitor needs per over-use policy, each granted only when
its feature is on. Strict schema validity for Kubernetes 1.29 to 1.35 and least privilege."""

from __future__ import annotations

from typing import Any

import chartkit
import pytest

from gpuslice import config
from gpuslice.deviceplugin import main
from gpuslice.mps import main as mps_daemon

pytestmark = pytest.mark.helm

RENDERS: dict[str, dict[str, Any]] = {
    "mps": {"config": {"mps": {"enabled": True}}},
    "mps-driver-root": {
        "config": {"mps": {"enabled": True, "shmDirectory": "/run/gpu-shm"}},
        "devicePlugin": {"runtimeClassName": "", "driverRoot": "/run/nvidia/driver"},
    },
    "monitor-warn": {},
    "monitor-evict": {"config": {"monitor": {"overusePolicy": "evict"}}},
    "monitor-kill": {"config": {"monitor": {"overusePolicy": "kill"}}},
    "monitor-off": {"config": {"monitor": {"enabled": False}}},
}


def shared_config(manifests: chartkit.Manifests, tmp_path) -> config.Config:
    path = tmp_path / "config.yaml"
    path.write_text(manifests.one("ConfigMap", "config")["data"]["config.yaml"])
    return config.load(path, environ={})


@pytest.mark.parametrize("kube_version", chartkit.KUBE_VERSIONS)
@pytest.mark.parametrize("render", list(RENDERS))
def test_every_render_validates_strictly(render, kube_version):
    values = RENDERS[render]
    if kube_version.startswith("1.29."):  # renders only with unconfined node writes accepted
        values = chartkit.merged(values, chartkit.UNCONFINED_NODE_WRITES)
    for obj in chartkit.render(values, kube_version):
        try:
            errors = chartkit.schema_errors(obj, kube_version)
        except chartkit.NoSchema:
            continue
        assert not errors, (obj["kind"], obj["metadata"]["name"], errors)


# --- the MPS control daemon -------------------------------------------------------------------


def test_no_mps_daemon_unless_mps_is_enabled():
    assert not chartkit.render({}).all("DaemonSet", "mps-control-daemon")


@pytest.mark.parametrize("render", ["mps", "mps-driver-root"])
def test_the_mps_daemon_runs_where_the_plugin_runs_and_shares_the_pipe_and_shm_the_pods_get(render, tmp_path):
    manifests = chartkit.render(RENDERS[render])
    settings = shared_config(manifests, tmp_path)
    daemon = manifests.one("DaemonSet", "mps-control-daemon")
    plugin = manifests.one("DaemonSet", "device-plugin")
    spec, plugin_spec = chartkit.pod_spec(daemon), chartkit.pod_spec(plugin)
    for key in ("nodeSelector", "tolerations", "priorityClassName", "affinity"):
        assert spec.get(key) == plugin_spec.get(key), key
    assert spec.get("runtimeClassName") == plugin_spec.get("runtimeClassName")
    container = chartkit.container(daemon)
    assert container["command"] == ["gpuslice-mps-control-daemon"]
    args = mps_daemon._parser().parse_args(container["args"])
    # The pipe directory the daemon serves is the host directory Allocate mounts into pods.
    assert args.pipe_directory == settings.mps.pipe_directory
    assert chartkit.mount_for(container, args.pipe_directory)["name"] == "mps-pipe"
    pipe = chartkit.volume(daemon, "mps-pipe")["hostPath"]
    assert pipe == {"path": settings.mps.pipe_directory, "type": "DirectoryOrCreate"}
    # /dev/shm of the daemon is the host directory Allocate mounts as the pods' /dev/shm.
    assert args.shm_directory == "/dev/shm"
    shm = chartkit.mount_for(container, "/dev/shm")
    assert chartkit.volume(daemon, shm["name"])["hostPath"]["path"] == settings.mps.shm_directory
    log = chartkit.mount_for(container, args.log_directory)
    assert chartkit.volume(daemon, log["name"])["hostPath"]["type"] == "DirectoryOrCreate"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # MPS binaries come with compute
    probe = container["readinessProbe"]["exec"]["command"]
    assert probe[:2] == ["gpuslice-mps-control-daemon", "--check"] and probe[2:] == container["args"]
    if render == "mps-driver-root":
        assert args.control == "/driver-root/usr/bin/nvidia-cuda-mps-control"
        assert chartkit.mount_for(container, "/driver-root")["readOnly"] is True
    else:
        assert args.control == "nvidia-cuda-mps-control"


def test_the_mps_daemon_runs_as_root_with_only_setuid_and_setgid_and_no_api_access():
    daemon = chartkit.render(RENDERS["mps"]).one("DaemonSet", "mps-control-daemon")
    spec = chartkit.pod_spec(daemon)
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(flag), flag
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # root: the control daemon starts each MPS server as its client's user
    assert spec["securityContext"]["runAsUser"] == 0
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert context == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["SETUID", "SETGID"]},
        "readOnlyRootFilesystem": True,
    }
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"/run/nvidia/mps/pipe", "/run/nvidia/mps/log", "/run/nvidia/mps/shm"}


# --- the usage monitor ------------------------------------------------------------------------


def plugin_of(render: str) -> tuple[dict[str, Any], dict[str, Any]]:
    daemonset = chartkit.render(RENDERS[render]).one("DaemonSet", "device-plugin")
    return chartkit.pod_spec(daemonset), chartkit.container(daemonset)


def monitor_rules(render: str) -> list[dict[str, Any]] | None:
    manifests = chartkit.render(RENDERS[render])
    roles = manifests.all("ClusterRole", "device-plugin-monitor")
    if not roles:
        return None
    (binding,) = manifests.all("ClusterRoleBinding", "device-plugin-monitor")
    assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert subject["name"] == manifests.one("ServiceAccount", "device-plugin")["metadata"]["name"]
    return roles[0]["rules"]


def test_by_default_the_monitor_reads_the_hosts_proc_read_only_and_may_only_create_events():
    spec, plugin = plugin_of("monitor-warn")
    assert chartkit.arg_value(plugin, "--proc-root") == "/host/proc"
    mount = chartkit.mount_for(plugin, "/host/proc")
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"] == {"path": "/proc", "type": "Directory"}
    assert not spec.get("hostPID")
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert monitor_rules("monitor-warn") == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def test_the_evict_policy_adds_only_the_eviction_subresource():
    assert monitor_rules("monitor-evict") == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]
    spec, plugin = plugin_of("monitor-evict")
    assert not spec.get("hostPID") and plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_kill_policy_runs_in_the_hosts_pid_namespace_with_only_cap_kill():
    spec, plugin = plugin_of("monitor-kill")
    assert spec["hostPID"] is True
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    assert plugin["securityContext"]["allowPrivilegeEscalation"] is False
    assert chartkit.arg_value(plugin, "--proc-root") == "/proc"  # the host's, through hostPID
    assert chartkit.mount_for(plugin, "/host/proc") is None
    assert monitor_rules("monitor-kill") == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def test_with_the_monitor_off_nothing_of_it_is_granted(tmp_path):
    manifests = chartkit.render(RENDERS["monitor-off"])
    assert shared_config(manifests, tmp_path).monitor.enabled is False
    spec, plugin = plugin_of("monitor-off")
    assert chartkit.mount_for(plugin, "/host/proc") is None and not spec.get("hostPID")
    assert not any(arg.startswith("--proc-root") for arg in plugin["args"])
    assert monitor_rules("monitor-off") is None


@pytest.mark.parametrize("render", ["monitor-warn", "monitor-kill"])
def test_the_plugin_accepts_the_proc_root_the_chart_gives_it(render, tmp_path):
    manifests = chartkit.render(RENDERS[render])
    (tmp_path / "config.yaml").write_text(manifests.one("ConfigMap", "config")["data"]["config.yaml"])
    _, plugin = plugin_of(render)
    args = [a.replace("/etc/gpuslice/config.yaml", str(tmp_path / "config.yaml")) for a in plugin["args"]]
    settings, options, _ = main.parse_args(args)
    assert options.proc_root == chartkit.arg_value(plugin, "--proc-root")
    assert settings.monitor.overuse_policy == ("kill" if render == "monitor-kill" else "warn")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"monitor": {"overusePolicy": "delete"}}}, "overusePolicy"),
        ({"config": {"monitor": {"overuseToleranceMiB": -1}}}, "overuseToleranceMiB"),
        ({"config": {"mps": {"shmDirectory": "relative"}}}, "shmDirectory"),
    ],
)
def test_bad_monitor_and_mps_values_are_refused_naming_the_key(values, message, tmp_path):
    result = chartkit.run_helm(*chartkit.template_args(values, tmp_path))
    assert result.returncode != 0 and message in result.stderr
