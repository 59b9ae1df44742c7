"""The control plane itself: the version the suite runs against, loopback only, and a pod that the
real kube-scheduler binds to a Node object with extended resources (what every other e2e test builds on)."""

from __future__ import annotations

import pathlib
import re

import k8skit
import kubernetes
import pytest

from gpuslice.sim import controlplane, profiling

pytestmark = pytest.mark.e2e

GO_MOD = pathlib.Path(__file__).resolve().parents[2] / "e2e" / "k8s" / "go.mod"


def test_the_api_server_reports_the_kubernetes_version_pinned_in_go_mod(cluster: controlplane.ControlPlane) -> None:
    pinned = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", GO_MOD.read_text(), re.M)
    assert pinned is not None
    version = cluster.version()
    print(f"\nreal Kubernetes under test: kube-apiserver {version}")  # recorded in the test output
    assert version == pinned.group(1) == cluster.binaries.version


def test_every_component_listens_on_loopback_only(cluster: controlplane.ControlPlane) -> None:
    assert cluster.server.startswith("https://127.0.0.1:")
    assert cluster.etcd_url.startswith("http://127.0.0.1:")
    for process in cluster.processes:
        argv = " ".join(process.popen.args)
        for address in re.findall(r"(?:bind-address|listen-[a-z-]+urls|advertise-address)=(\S+)", argv):
            assert address.startswith(("127.0.0.1", "http://127.0.0.1")) or address == "", (process.name, address)


def test_the_real_scheduler_binds_a_pod_by_an_extended_resource(
    core: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    small = f"{namespace}-small"
    big = f"{namespace}-big"
    core.create_node(k8skit.node_object(small, allocatable={"example.com/thing": "1"}))
    core.create_node(k8skit.node_object(big, allocatable={"example.com/thing": "4"}))
    core.create_namespaced_pod(
        namespace,
        k8skit.pod_object(
            "wants-three",
            limits={"example.com/thing": 3},
            nodeSelector={"kubernetes.io/hostname": big},
        ),
    )
    assert k8skit.bound_node(core, namespace, "wants-three") == big
    core.create_namespaced_pod(
        namespace,
        k8skit.pod_object("wants-two", limits={"example.com/thing": 2}, nodeSelector={"kubernetes.io/hostname": big}),
    )
    message = k8skit.scheduling_failure(core, namespace, "wants-two")
    assert "Insufficient example.com/thing" in message


def test_the_schedulers_cpu_profile_is_read_as_admin_and_written_by_the_replays_profiler(
    cluster: controlplane.ControlPlane, tmp_path: pathlib.Path
) -> None:
    # What `gpuslice-sim --profile-scheduler` reads: pprof's gzip-compressed protobuf, one per period.
    assert cluster.cpu_profile("kube-scheduler", 1)[:2] == b"\x1f\x8b"
    profiler = profiling.SchedulerProfiler(cluster, tmp_path / "profiles", seconds=1).start()
    k8skit.wait_for("a profile written", lambda: profiler.written or None, timeout=30, interval=0.2)
    profiler.stop()
    assert all(path.read_bytes()[:2] == b"\x1f\x8b" for path in profiler.written), profiler.written
    with pytest.raises(KeyError):
        cluster.cpu_profile("no-such-scheduler", 1)
