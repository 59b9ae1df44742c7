"""The chart in device-plugin mode on the real node, installed with `helm install` as a user would:
the plugin DaemonSet pod (our image, NVML from the node's driver root, here the NVML built on
go-nvml's mock DGX A100 with GPU 0 in MIG mode) registers with the real kubelet, the webhook runs as
the chart's pods and the API server calls it through its Service's endpoints, the controller's two
pods elect a leader that requeues what kubelet refuses, and pods written for KAI run with the share
they asked for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import nodepods
import pytest
import realnode
from nodepods import CONTRACT

MIG_LAYOUT = {"0": ["3g.20gb", "2g.10gb", "1g.5gb"]}  # GPU 0 in MIG mode; GPUs 1-7 shared by memory
SHARED_GPUS = 7
UNITS_PER_GPU = 40960 // CONTRACT.unit_mib  # A100-SXM4-40GB
NODE_UNITS = SHARED_GPUS * UNITS_PER_GPU


def chart_values(image: dict[str, str], **config: Any) -> dict[str, Any]:
    """The chart's defaults but for the image (built here) and faster monitoring: the plugin runs
    under RuntimeClass nvidia, whose runtime gives it NVML from the node's CDI specification."""
    return {"image": image, "config": {"monitor": {"intervalSeconds": 1, "overuseSeconds": 2}, **config}}


@pytest.fixture(scope="module")
def release(
    real_node: realnode.RealNode, node_core: kubernetes.client.CoreV1Api, mock_driver: realnode.MockDriver, image
) -> Iterator[nodepods.Release]:
    mock_driver.set_state({"mig": MIG_LAYOUT})
    mock_driver.publish_cdi_spec()
    node_core.patch_node(realnode.NODE_NAME, {"metadata": {"labels": {f"{CONTRACT.prefix}/enabled": "true"}}})
    installed = nodepods.Release(real_node, node_core, "gp", "gpuslice")
    installed.install(chart_values(image))
    try:
        installed.wait_ready("device-plugin")
        installed.wait_ready("webhook", count=2)
        installed.wait_ready("controller", count=2)
        # kubelet posts what the plugin registered with the Node's status a few seconds later
        k8skit.wait_for(
            "the units in the node's allocatable",
            lambda: nodepods.allocatable(node_core).get(CONTRACT.gpu_memory_resource) == str(NODE_UNITS),
            60,
        )
        yield installed
    finally:
        installed.uninstall()
        node_core.patch_node(realnode.NODE_NAME, {"metadata": {"labels": {f"{CONTRACT.prefix}/enabled": None}}})


@pytest.fixture(scope="module")
def gpus(mock_driver: realnode.MockDriver, release: nodepods.Release) -> dict[str, dict[str, Any]]:
    """The mock's GPUs and MIG devices by UUID, as NVML presents them to a process of this host."""
    found: dict[str, dict[str, Any]] = {}
    for gpu in mock_driver.gpus():
        found[gpu["uuid"]] = gpu
        for mig in gpu["mig"]:
            found[mig["uuid"]] = {**mig, "parent": gpu["uuid"]}
    return found


def test_the_plugin_pod_registers_with_kubelet_and_the_node_offers_units_and_mig_slices(node_core, release, gpus):
    allocatable = nodepods.allocatable(node_core)
    assert allocatable[CONTRACT.gpu_memory_resource] == str(NODE_UNITS)
    for profile in ("3g.20gb", "2g.10gb", "1g.5gb"):
        assert allocatable[CONTRACT.mig_resource(profile)] == "1", allocatable
    labels = nodepods.node_labels(node_core)
    assert labels[CONTRACT.label_gpu_count] == str(SHARED_GPUS)
    assert labels[CONTRACT.label_gpu_product] == "NVIDIA-A100-SXM4-40GB"
    assert labels[CONTRACT.label_free_units] == str(NODE_UNITS)
    (plugin,) = release.wait_ready("device-plugin")
    log = node_core.read_namespaced_pod_log(plugin.metadata.name, release.namespace)
    assert "from nvml" in log, log[-2000:]
    assert len([g for g in gpus.values() if "parent" not in g]) == 8


def test_kai_pods_are_converted_by_the_webhook_pods_and_run_with_their_share(node_core, node_namespace, release, gpus):
    before = int(nodepods.node_labels(node_core)[CONTRACT.label_free_units])
    pods = [
        # Under NVIDIA's runtime, as on a GPU Operator node: the UUID the plugin sets picks the device.
        nodepods.kai_pod(
            "fraction", {"gpu-fraction": "0.5"}, limits={"nvidia.com/gpu": "1"}, spec={"runtimeClassName": "nvidia"}
        ),
        nodepods.kai_pod("memory", {"gpu-memory": "2000"}, limits={"nvidia.com/gpu": "1"}),
        nodepods.kai_pod(
            "queued",
            {"gpu-memory": "2000"},
            labels={"kai.scheduler/queue": "test"},
            spec={
                "schedulerName": "kai-scheduler",
                "restartPolicy": "Never",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        ),
        nodepods.kai_pod("isolated", {"gpu-memory": "4000", f"{CONTRACT.prefix}/isolation": "mig"}),
        # written for NVIDIA's plugin (mixed MIG strategy) and for HAMi: converted by the webhook
        nodepods.kai_pod("nvidia-mig", {}, limits={"nvidia.com/mig-2g.10gb": "1"}),
        nodepods.kai_pod("hami", {}, limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
    ]
    for pod in pods:
        node_core.create_namespaced_pod(node_namespace, pod)
    reports = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        nodepods.running(node_core, node_namespace, name)
        reports[name] = nodepods.report(node_core, node_namespace, name)
    fraction = reports["fraction"]
    assert fraction["GPUSLICE_MEMORY_LIMIT_MIB"] == "20480" and fraction["GPU_PORTION"] == "0.5", fraction
    for name in ("fraction", "memory", "queued", "hami"):
        device = reports[name]["NVIDIA_VISIBLE_DEVICES"]
        assert device in gpus and "parent" not in gpus[device], (name, device)
    assert reports["memory"]["GPUSLICE_MEMORY_LIMIT_MIB"] == "2048"  # 2000 MiB in 256 MiB units
    minor = gpus[fraction["NVIDIA_VISIBLE_DEVICES"]]["minor"]
    assert fraction["devices"].split() == sorted([f"nvidia{minor}", "nvidiactl"]), fraction["devices"]
    assert reports["memory"]["devices"] == ""  # no runtime class: the variable alone, no device node
    queued = node_core.read_namespaced_pod("queued", node_namespace)
    assert queued.spec.scheduler_name != "kai-scheduler"
    isolated = reports["isolated"]["NVIDIA_VISIBLE_DEVICES"]
    assert gpus[isolated].get("profile") == "1g.5gb", reports["isolated"]  # the smallest MIG slice that fits
    assert gpus[reports["nvidia-mig"]["NVIDIA_VISIBLE_DEVICES"]].get("profile") == "2g.10gb"
    assert reports["hami"]["GPUSLICE_MEMORY_LIMIT_MIB"] == "3072"  # 3000 MiB in 256 MiB units
    used = (20480 + 2048 + 2048 + 3072) // CONTRACT.unit_mib
    nodepods.wait_for_label(node_core, CONTRACT.label_free_units, str(before - used))
    nodepods.wait_for_label(node_core, CONTRACT.label_mig_free("1g.5gb"), "0")


def test_with_cdi_cri_containerd_injects_the_devices_and_nvml_of_an_nvidia_ctk_spec(
    node_core, node_namespace, release, real_node, mock_driver, image, gpus
):
    old = {p.metadata.name for p in release.wait_ready("device-plugin")}
    try:
        release.install(chart_values(image, deviceListStrategy="cdi-cri"), upgrade=True)
        release.rolled("device-plugin", old)
        # The gpuslice image's Python and nvidia-ml-py, with libnvidia-ml coming only from the CDI spec.
        probe = (
            "python -c 'import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); "
            'print("NVML_SEES=" + pynvml.nvmlDeviceGetName(h))\'; ' + nodepods.REPORT
        )
        pod = nodepods.kai_pod(
            "cdi",
            {"gpu-memory": "8000"},
            image=f"{image['repository']}:{image['tag']}",
            command=probe,
        )
        node_core.create_namespaced_pod(node_namespace, pod)
        nodepods.running(node_core, node_namespace, "cdi")
        seen = nodepods.report(node_core, node_namespace, "cdi")
        assert seen.get("NVML_SEES") == "NVIDIA A100-SXM4-40GB", seen
        assert "NVIDIA_VISIBLE_DEVICES" not in seen  # cdi-cri names devices, it sets no variable
        minors = {f"nvidia{g['minor']}" for g in gpus.values() if "minor" in g}
        devices = set(seen["devices"].split())
        assert "nvidiactl" in devices and len(devices & minors) == 1, seen["devices"]
        assert seen["GPUSLICE_MEMORY_LIMIT_MIB"] == "8192"
    finally:
        old = {p.metadata.name for p in release.wait_ready("device-plugin")}
        release.install(chart_values(image), upgrade=True)
        release.rolled("device-plugin", old)


def test_a_pod_whose_units_would_span_gpus_is_refused_by_kubelet_then_requeued_and_runs(
    node_core, node_namespace, release
):
    """A converted pod bound by spec.nodeName skips the scheduler and the steering labels: kubelet
    must refuse it when no single GPU holds its units (UnexpectedAdmissionError), and the leader of
    the controller's pods recreates it unbound, so that it waits for room instead of being lost."""
    fillers = [f"filler-{i}" for i in range(SHARED_GPUS)]
    for name in fillers:  # 0.6 of a GPU each: no two share a GPU, each GPU keeps 0.4 free
        node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod(name, {"gpu-fraction": "0.6"}))
    for name in fillers:
        nodepods.running(node_core, node_namespace, name)
    pinned = nodepods.kai_pod("pinned", {"gpu-fraction": "0.5"}, spec={"nodeName": realnode.NODE_NAME})
    first = node_core.create_namespaced_pod(node_namespace, pinned)

    def refused() -> Any:
        events = nodepods.events_of(node_core, node_namespace, "pinned")
        return [
            e
            for e in events
            if e.involved_object.uid == first.metadata.uid and "UnexpectedAdmissionError" in (e.reason or "")
        ] or None

    (event,) = k8skit.wait_for("kubelet's refusal", refused, 60)[:1]
    assert "gpu-memory" in event.message, event.message

    def requeued() -> Any:
        try:
            pod = node_core.read_namespaced_pod("pinned", node_namespace)
        except kubernetes.client.ApiException:
            return None
        return pod if pod.metadata.uid != first.metadata.uid else None

    again = k8skit.wait_for("the requeued pod", requeued, 60)
    assert again.metadata.annotations[CONTRACT.requeues_annotation] == "1"
    # One of the two controller pods leads, by the Lease the chart names after the release.
    lease = kubernetes.client.CoordinationV1Api(node_core.api_client).read_namespaced_lease(
        f"{release.fullname}-controller", release.namespace
    )
    controllers = {p.metadata.name for p in release.wait_ready("controller", count=2)}
    assert len(controllers) == 2 and lease.spec.holder_identity in controllers, (lease.spec, controllers)
    assert again.spec.node_name is None  # unbound: it waits for the scheduler and the labels
    node_core.delete_namespaced_pod(fillers[0], node_namespace, grace_period_seconds=0)
    pod = nodepods.running(node_core, node_namespace, "pinned", timeout=120)
    assert pod.metadata.uid == again.metadata.uid
    assert nodepods.report(node_core, node_namespace, "pinned")["GPUSLICE_MEMORY_LIMIT_MIB"] == "20480"


def test_the_monitor_finds_the_pod_over_its_grant_through_its_cgroup_and_the_policy_acts(
    node_core, node_namespace, release, mock_driver, image
):
    node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod("greedy", {"gpu-memory": "4096"}))
    pod = nodepods.running(node_core, node_namespace, "greedy")
    device = nodepods.report(node_core, node_namespace, "greedy")["NVIDIA_VISIBLE_DEVICES"]
    (pid,) = nodepods.pod_pids(pod.metadata.uid, "sleep")  # the container's process, by its cgroup
    # It now holds 6000 MiB on its GPU, as NVML would report it.
    mock_driver.set_state({"mig": MIG_LAYOUT, "processes": {device: [{"pid": pid, "usedMiB": 6000}]}})
    try:

        def warned() -> Any:
            return [
                e for e in nodepods.events_of(node_core, node_namespace, "greedy") if e.reason == "GPUMemoryOverUse"
            ]

        (event,) = k8skit.wait_for("the over-use Event", warned, 60)[:1]
        assert "uses 6000 MiB" in event.message and "grant of 4096 MiB" in event.message, event.message
        assert event.involved_object.uid == pod.metadata.uid
        old = {p.metadata.name for p in release.wait_ready("device-plugin")}
        release.install(
            chart_values(image, monitor={"intervalSeconds": 1, "overuseSeconds": 2, "overusePolicy": "evict"}),
            upgrade=True,
        )
        release.rolled("device-plugin", old)

        def evicted() -> bool:
            try:
                current = node_core.read_namespaced_pod("greedy", node_namespace)
            except kubernetes.client.ApiException as exc:
                return exc.status == 404
            return current.metadata.deletion_timestamp is not None or current.status.reason == "Evicted"

        k8skit.wait_for("the pod evicted", evicted, 90)
    finally:
        mock_driver.set_state({"mig": MIG_LAYOUT})
        old = {p.metadata.name for p in release.wait_ready("device-plugin")}
        release.install(chart_values(image), upgrade=True)
        release.rolled("device-plugin", old)


def test_the_mps_daemon_runs_in_a_pod_and_without_a_gpu_says_why_while_the_rest_works(
    node_core, node_namespace, release, mock_driver, image
):
    old = {p.metadata.name for p in release.wait_ready("device-plugin")}
    try:
        release.install(chart_values(image, mps={"enabled": True}), upgrade=True)
        release.rolled("device-plugin", old)
        prefix = f"{release.fullname}-mps-control-daemon-"

        def said_why() -> Any:
            # The chart's FallbackToLogsOnError: the failed start's last lines are the container's message.
            for pod in node_core.list_namespaced_pod(release.namespace).items:
                if pod.metadata.name.startswith(prefix):
                    for status in pod.status.container_statuses or []:
                        ended = status.state.terminated or (status.last_state and status.last_state.terminated)
                        if ended and ended.message:
                            return ended.message
            return None

        reason = k8skit.wait_for("the MPS daemon's reason", said_why, 120)
        assert "nvidia-cuda-mps-control" in reason, reason
        node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod("with-mps", {"gpu-memory": "2048"}))
        nodepods.running(node_core, node_namespace, "with-mps")
        seen = nodepods.report(node_core, node_namespace, "with-mps")
        assert seen["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M", seen
    finally:
        old = {p.metadata.name for p in release.wait_ready("device-plugin")}
        release.install(chart_values(image), upgrade=True)
        release.rolled("device-plugin", old)


def test_kubelet_and_plugin_restarts_keep_running_pods_and_serve_new_ones(
    node_core, node_namespace, release, real_node, gpus
):
    node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod("before", {"gpu-memory": "4096"}))
    before = nodepods.running(node_core, node_namespace, "before")
    real_node.stop_kubelet()
    real_node.start_kubelet()
    k8skit.wait_for(
        "the units offered again",
        lambda: nodepods.allocatable(node_core).get(CONTRACT.gpu_memory_resource) == str(NODE_UNITS) or None,
        120,
    )
    node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod("after-kubelet", {"gpu-memory": "4096"}))
    nodepods.running(node_core, node_namespace, "after-kubelet")
    (plugin,) = release.wait_ready("device-plugin")
    node_core.delete_namespaced_pod(plugin.metadata.name, release.namespace)
    release.rolled("device-plugin", {plugin.metadata.name})
    node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod("after-plugin", {"gpu-memory": "4096"}))
    nodepods.running(node_core, node_namespace, "after-plugin")
    still = node_core.read_namespaced_pod("before", node_namespace)
    assert still.metadata.uid == before.metadata.uid and still.status.phase == "Running"
    assert still.status.container_statuses[0].restart_count == 0
    for name in ("before", "after-kubelet", "after-plugin"):  # each given a GPU of this node
        assert nodepods.report(node_core, node_namespace, name)["NVIDIA_VISIBLE_DEVICES"] in gpus, name
