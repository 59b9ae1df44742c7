"""The control plane itself: the version the suite runs against, loopback only, and a pod that the
real kube-scheduler binds to a Node object with extended resources (what every other e2e test builds on)."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import k8skit
import kubernetes
import pytest

from gpuslice import compact, podwire
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


def test_the_schedulers_metrics_count_its_attempts_and_what_queued_each_pod(
    cluster: controlplane.ControlPlane, core: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    # What a replay's diagnosis reports (sim/profiling.py): read before and after one pod that
    # cannot be placed, the real scheduler's own counters move by that pod.
    def counts() -> dict[str, dict[str, int]]:
        return profiling.scheduling_counts(cluster.scheduler_metrics("kube-scheduler"))

    before = counts()
    core.create_namespaced_pod(
        namespace, k8skit.pod_object("nowhere", nodeSelector={"kubernetes.io/hostname": f"{namespace}-none"})
    )
    k8skit.scheduling_failure(core, namespace, "nowhere")

    def counted() -> dict[str, dict[str, int]] | None:
        now = counts()
        return now if now["attempts"].get("unschedulable", 0) > before["attempts"].get("unschedulable", 0) else None

    after = k8skit.wait_for("the scheduler's metrics to count the attempt", counted, timeout=30, interval=0.5)
    added = "UnscheduledPodAdd: active"
    assert after["pods_queued_by_event"][added] > before["pods_queued_by_event"].get(added, 0), after
    assert after["attempts"].get("scheduled", 0) >= before["attempts"].get("scheduled", 0)
    with pytest.raises(KeyError):
        cluster.scheduler_metrics("no-such-scheduler")


def test_pods_read_as_protobuf_are_the_pods_read_as_json(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """What the compact pod watches read (gpuslice.podwire): the real API server's protobuf lists and
    watch streams give the same pods as its JSON through the typed decode, field for field."""
    gated = {
        "metadata": {"name": "gated", "labels": {"app": "a"}, "annotations": {"gpuslice.io/decision": "{}"}},
        "spec": {
            "schedulingGates": [{"name": "gpuslice.io/pacing"}],
            "nodeSelector": {"gpuslice.io/gpu.product": "NVIDIA-H100"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "gpu.free-units", "operator": "Gt", "values": ["7"]}]}
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 5, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}
                    ],
                }
            },
            "initContainers": [{"name": "sidecar", "image": "registry.invalid/e2e:1", "restartPolicy": "Always"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/e2e:1",
                    "env": [{"name": "A", "value": "x" * 200}],
                    "resources": {
                        "limits": {"gpuslice.io/gpu-memory": "8", "memory": "1Gi"},
                        "claims": [{"name": "gpu"}],
                    },
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share"}],
        },
    }
    core.create_namespaced_pod(namespace, gated)
    bound = k8skit.pod_object("bound", limits={"gpuslice.io/gpu-memory": 4}, nodeName="no-such-node")
    bound["metadata"]["finalizers"] = ["example.com/hold"]  # deleted, it stays with its deletionTimestamp
    core.create_namespaced_pod(namespace, bound)
    core.delete_namespaced_pod("bound", namespace)
    core.create_namespaced_pod(namespace, k8skit.pod_object("refused", limits={"gpuslice.io/gpu-memory": 2}))
    core.patch_namespaced_pod_status(
        "refused",
        namespace,
        {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}},
    )
    try:

        def listed() -> tuple[list[dict[str, Any]], str, list[dict[str, Any]], str] | None:
            as_protobuf = core.list_namespaced_pod(
                namespace, _preload_content=False, _headers={"Accept": podwire.ACCEPT_LIST}
            )
            assert podwire.is_protobuf(as_protobuf.headers["Content-Type"])
            pods, _, version = podwire.pod_page(as_protobuf.data)
            json_pods, _, json_version = compact.pod_page(
                core.list_namespaced_pod(namespace, _preload_content=False).data
            )
            # the scheduler and the pod garbage collector may write between the two reads: read again
            return (pods, version, json_pods, json_version) if version == json_version else None

        pods, _, json_pods, _ = k8skit.wait_for("two lists of one version", listed, timeout=30, interval=0.5)
        assert pods == json_pods
        assert {p["metadata"]["name"] for p in pods} == {"gated", "bound", "refused"}
        assert any("deletionTimestamp" in p["metadata"] for p in pods)

        def streamed(accept: str | None) -> list[tuple[str, dict[str, Any]]]:
            headers = {"Accept": accept} if accept else None
            response = core.list_namespaced_pod(
                namespace,
                watch=True,
                send_initial_events=True,
                resource_version_match="NotOlderThan",
                allow_watch_bookmarks=True,
                timeout_seconds=5,
                _preload_content=False,
                _headers=headers,
            )
            if podwire.is_protobuf(response.headers["Content-Type"]):
                decoded = (podwire.pod_event(f) for f in podwire.frames(response.stream(4096)))
            else:
                decoded = (compact.pod_event(line) for line in response if line.strip())
            events: list[tuple[str, dict[str, Any]]] = []
            try:
                for kind, obj in decoded:  # the pods in the order sent, then the bookmark that ends them
                    events.append((kind, obj if kind != "BOOKMARK" else obj["metadata"]))
                    if kind == "BOOKMARK":
                        break
            finally:
                decoded.close()
                response.release_conn()
            return events

        def both() -> tuple[list[Any], list[Any]] | None:
            from_protobuf, from_json = streamed(podwire.ACCEPT_WATCH), streamed(None)
            versions = [
                [obj["metadata"]["resourceVersion"] for _, obj in events[:3]] for events in (from_protobuf, from_json)
            ]
            return (from_protobuf, from_json) if versions[0] == versions[1] else None

        from_protobuf, from_json = k8skit.wait_for("two streams of one version", both, timeout=30, interval=0.5)
        assert [kind for kind, _ in from_protobuf] == ["ADDED"] * 3 + ["BOOKMARK"]
        assert from_protobuf[:3] == from_json[:3]
        assert from_protobuf[3][1]["annotations"] == {"k8s.io/initial-events-end": "true"}
    finally:
        core.patch_namespaced_pod("bound", namespace, {"metadata": {"finalizers": None}})
