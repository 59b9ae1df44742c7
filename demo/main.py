"""`gpuslice-demo` (`make demo`): the whole gpuslice flow on one simulated node, no cluster, no GPU.

1. The real device plugin (gpuslice.deviceplugin.manager) serves the node file's GPUs
   (default: gpuslice/examples/demo-node.yaml, 2 x H100 80GB + an A100 in MIG mode) and registers
   over gRPC with the kubelet emulator (gpuslice.sim.kubelet), all on unix sockets in a temp dir.
2. The real webhook (gpuslice.webhook.server) serves HTTPS on 127.0.0.1 with a certificate made
   for this run (demo/tls.py); every demo pod goes to it as an AdmissionReview over HTTPS.
3. The mutated pod is scheduled by the simulator's kube-scheduler model, then the emulator
   allocates its devices through real GetPreferredAllocation and Allocate calls.
4. A short report: pod -> GPU, memory, the container's environment, denials, GPUs saved.

Everything started is stopped and the temp dir removed, also on errors and Ctrl-C.
May import gpuslice.{config, contract}, gpuslice.deviceplugin, gpuslice.webhook, gpuslice.sim and the demo's
own modules.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import importlib.resources
import json
import pathlib
import shutil
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import jsonpatch
import numpy as np

from gpuslice import config
from gpuslice import contract as contract_
from gpuslice.demo import pods as demo_pods
from gpuslice.demo import tls
from gpuslice.deviceplugin import manager
from gpuslice.node import health, inventory, labels, metrics, nodefile
from gpuslice.sim import kubelet as kubelet_
from gpuslice.sim import scheduler
from gpuslice.webhook import cluster as cluster_
from gpuslice.webhook import server as webhook_server

__all__ = ["PodResult", "Report", "main", "run_demo"]

NODE_NAME = "demo-node"
NODE_CPU_MILLI = 64_000
NODE_MEMORY_BYTES = 512 * 1024**3
_SHOWN_ENV = (
    contract_.ENV_VISIBLE_DEVICES,
    contract_.ENV_MEMORY_LIMIT_MIB,
    contract_.ENV_GPU_FRACTION,
    contract_.ENV_KAI_GPU_PORTION,
)


@dataclasses.dataclass
class PodResult:
    name: str  # namespace/name
    asked: str  # the annotations (or resources) the user wrote
    denied: str = ""  # the webhook's message when refused
    warnings: tuple[str, ...] = ()
    request: str = ""  # what the webhook converted it to
    node: str = ""
    gpus: tuple[str, ...] = ()  # physical GPU UUIDs the container got (MIG: the parent)
    where: str = ""  # readable GPU / MIG placement
    memory_mib: int = 0
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    failed: str = ""  # FailedScheduling or kubelet admission message


@dataclasses.dataclass
class Report:
    node_summary: str
    plugin_resources: dict[str, int]
    webhook_url: str
    pods: list[PodResult]
    seconds: float = 0.0

    @property
    def placed(self) -> list[PodResult]:
        return [p for p in self.pods if p.gpus]

    @property
    def gpus_used(self) -> int:
        return len({g for p in self.placed for g in p.gpus})

    def render(self) -> str:
        lines = [
            "gpuslice demo: the real device plugin and webhook on a simulated node (no cluster, no GPU)",
            f"  node {NODE_NAME}: {self.node_summary}",
            "  device plugin registered with the kubelet emulator over gRPC: "
            + ", ".join(f"{r} x{n}" for r, n in self.plugin_resources.items()),
            f"  webhook serving {self.webhook_url} (TLS certificate generated for this run)",
            "",
        ]
        for pod in self.pods:
            lines.append(f"{pod.name}  [{pod.asked}]")
            if pod.denied:
                lines.append(f"  DENIED by the webhook: {pod.denied}")
                continue
            lines.append(f"  webhook -> {pod.request}")
            for warning in pod.warnings:
                lines.append(f"  warning: {warning}")
            if pod.failed:
                lines.append(f"  NOT PLACED: {pod.failed}")
                continue
            if not pod.gpus:
                lines.append(f"  placed on {pod.node}, no GPU")
                continue
            lines.append(f"  placed on {pod.node}, {pod.where}: {pod.memory_mib} MiB")
            lines.append("  env: " + " ".join(f"{k}={v}" for k, v in pod.env.items()))
        placed, used = len(self.placed), self.gpus_used
        lines += [
            "",
            (
                f"{placed} GPU pods on {used} physical GPU{'s' if used != 1 else ''}: "
                f"{placed - used} GPU{'s' if placed - used != 1 else ''} saved against one pod per GPU "
                f"({sum(1 for p in self.pods if p.denied)} pod denied with a clear message)."
            ),
            f"Done in {self.seconds:.1f} s; every server stopped and every socket removed.",
        ]
        return "\n".join(lines)


def _node_summary(node: inventory.NodeInventory) -> str:
    parts = []
    for gpu in node.gpus:
        if gpu.mig_enabled:
            profiles = "+".join(m.profile for m in gpu.mig)
            parts.append(f"GPU {gpu.index} {gpu.model} in MIG mode ({profiles})")
        else:
            parts.append(f"GPU {gpu.index} {gpu.model} ({gpu.memory_mib} MiB)")
    return "; ".join(parts)


def _asked(pod: dict[str, Any], contract: contract_.Contract) -> str:
    """The annotations the user wrote, and any nvidia.com/gpu it asks for (KAI's placeholder)."""
    annotations = pod["metadata"].get("annotations") or {}
    shown = [f"{k}={annotations[k]}" for k in contract.pod_annotations if k in annotations]
    for container in pod["spec"].get("containers") or ():
        limits = (container.get("resources") or {}).get("limits") or {}
        if contract_.NVIDIA_GPU in limits:
            shown.append(f"limits {contract_.NVIDIA_GPU}: {limits[contract_.NVIDIA_GPU]}")
    return ", ".join(shown) or "no annotations"


def _review(pod: dict[str, Any]) -> dict[str, Any]:
    """An AdmissionReview v1 for a pod CREATE, as kube-apiserver sends it."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"],
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "demo-user"},
            "object": pod,
            "dryRun": False,
        },
    }


def _extended_requests(pod: dict[str, Any], contract: contract_.Contract) -> str:
    parts = []
    for container in pod["spec"].get("containers") or ():
        limits = (container.get("resources") or {}).get("limits") or {}
        parts += [f"{r}: {v}" for r, v in limits.items() if contract.is_gpuslice_resource(r)]
    affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or ()
    expressions = [e for t in terms for e in t.get("matchExpressions") or ()]
    pins = [_expression(e) for e in expressions]
    if parts:
        return ", ".join(parts) + (f" (node affinity: {'; '.join(pins)})" if pins else "")
    # No GPU resource: show the preference a pod that asks for no device was given, if any.
    preferred = affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    prefers = [" and ".join(_expression(e) for e in t["preference"].get("matchExpressions") or ()) for t in preferred]
    return "no GPU resource" + (f" (prefers nodes where {' or '.join(prefers)})" if prefers else "")


def _asks_nvidia_gpu(pod: dict[str, Any]) -> bool:
    containers = pod["spec"].get("containers") or ()
    return any(contract_.NVIDIA_GPU in ((c.get("resources") or {}).get("limits") or {}) for c in containers)


def _expression(expression: dict[str, Any]) -> str:
    """A node selector requirement, short: "free-gpus Lt 1"."""
    values = ",".join(expression.get("values", []))
    return f"{expression['key'].split('/')[-1]} {expression['operator']}" + (f" {values}" if values else "")


@contextlib.asynccontextmanager
async def _running(
    settings: config.Config, node: inventory.NodeInventory, workdir: pathlib.Path
) -> AsyncIterator[tuple[kubelet_.Kubelet, manager.PluginManager, cluster_.ClusterView, str, ssl.SSLContext]]:
    """Kubelet emulator + device plugin + HTTPS webhook, all stopped on exit."""
    plugin_dir = workdir / "device-plugins"
    async with kubelet_.Kubelet(plugin_dir, workdir / "pod-resources" / "kubelet.sock") as kubelet:
        resources = manager.build_resources(node, settings)
        plugins = manager.PluginManager(
            resources,
            kubelet_dir=plugin_dir,
            health_state=health.HealthState(),
            plugin_metrics=metrics.Metrics(),
            poll_interval=0.2,
        )
        await plugins.start()
        runner = None
        try:
            for resource in resources:
                await kubelet.wait_for_resource(resource.name, devices=len(resource.device_ids))
            files = tls.write_certificates(workdir)
            from gpuslice.webhook import certs  # the webhook's own TLS loading

            server_context = certs.server_context(str(files.certificate), str(files.key))
            view = cluster_.ClusterView(settings.contract, default_gpu_memory_mib=settings.default_gpu_memory_mib)
            app = webhook_server.make_app(settings, view)
            runner = await webhook_server.start(app, server_context, host="127.0.0.1", port=0)
            port = runner.addresses[0][1]
            client_context = ssl.create_default_context(cafile=str(files.ca))
            yield kubelet, plugins, view, f"https://127.0.0.1:{port}/mutate", client_context
        finally:
            if runner is not None:
                await runner.cleanup()
            await plugins.stop()


def _labels_now(
    node: inventory.NodeInventory, contract: contract_.Contract, kubelet: kubelet_.Kubelet
) -> dict[str, str]:
    """The node's labels as the plugin's labeller would publish them from kubelet's allocations."""
    units: dict[str, int] = {}
    mig_in_use: set[str] = set()
    for resource, devices in kubelet.resources.items():
        for ids in devices.allocated.values():
            if resource == contract.gpu_memory_resource:
                for device_id in ids:
                    gpu = contract_.parse_unit_device_id(device_id).gpu_uuid
                    units[gpu] = units.get(gpu, 0) + 1
            elif resource.startswith(contract.mig_resource_prefix):
                mig_in_use.update(ids)
    return {
        "kubernetes.io/hostname": NODE_NAME,
        **labels.node_labels(node, contract, allocated=units, allocated_mig=mig_in_use),
    }


def _placement(node: inventory.NodeInventory, visible: str) -> tuple[tuple[str, ...], str]:
    uuids = [u for u in visible.split(",") if u]
    gpus: list[str] = []
    where = []
    mig = {m.uuid: m for m in node.mig_devices()}
    for device in uuids:
        if device in mig:
            parent = node.gpu(mig[device].parent_uuid)
            gpus.append(parent.uuid)
            where.append(f"MIG {mig[device].profile} on GPU {parent.index} ({parent.model})")
        else:
            gpu = node.gpu(device)
            gpus.append(gpu.uuid)
            where.append(f"GPU {gpu.index} ({gpu.model})")
    return tuple(dict.fromkeys(gpus)), ", ".join(where)


async def run_demo(settings: config.Config, node: inventory.NodeInventory, *, seed: int = 0) -> Report:
    """Run the flow in a fresh temp dir (short path: unix sockets allow 107 bytes) and report."""
    started = time.perf_counter()
    contract = settings.contract
    workdir = pathlib.Path(
        tempfile.mkdtemp(prefix="gpuslice-demo-", dir="/tmp" if pathlib.Path("/tmp").is_dir() else None)
    )
    results: list[PodResult] = []
    try:
        async with _running(settings, node, workdir) as (kubelet, _plugins, view, url, client_context):
            node_labels = _labels_now(node, contract, kubelet)
            view.update_node(NODE_NAME, node_labels)
            allocatable = {
                scheduler.CPU: NODE_CPU_MILLI,
                scheduler.MEMORY: NODE_MEMORY_BYTES,
                **{r: d.allocatable for r, d in kubelet.resources.items()},
            }
            cluster = scheduler.Cluster([NODE_NAME], [allocatable], [node_labels])
            sched = scheduler.Scheduler(cluster, scheduler.default_profile(), np.random.default_rng(seed))
            plugin_resources = {r: d.allocatable for r, d in sorted(kubelet.resources.items())}
            async with aiohttp.ClientSession() as session:
                for pod in demo_pods.demo_pods(contract):
                    results.append(
                        await _one_pod(pod, session, url, client_context, sched, kubelet, node, contract, view)
                    )
        report = Report(_node_summary(node), plugin_resources, url, results)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report.seconds = time.perf_counter() - started
    return report


async def _one_pod(
    pod: dict[str, Any],
    session: aiohttp.ClientSession,
    url: str,
    client_context: ssl.SSLContext,
    sched: scheduler.Scheduler,
    kubelet: kubelet_.Kubelet,
    node: inventory.NodeInventory,
    contract: contract_.Contract,
    view: cluster_.ClusterView,
) -> PodResult:
    meta = pod["metadata"]
    result = PodResult(name=f"{meta['namespace']}/{meta['name']}", asked=_asked(pod, contract))
    async with session.post(url, json=_review(pod), ssl=client_context) as response:
        response.raise_for_status()
        answer = (await response.json())["response"]
    if not answer["allowed"]:
        result.denied = answer.get("status", {}).get("message", "(no message)")
        return result
    result.warnings = tuple(answer.get("warnings") or ())
    placeholder = _asks_nvidia_gpu(pod)
    if answer.get("patch"):
        pod = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))
    result.request = _extended_requests(pod, contract)
    if placeholder and not _asks_nvidia_gpu(pod):
        result.request += f"; the {contract_.NVIDIA_GPU} placeholder removed"
    request = scheduler.read_pod(pod)
    decision = sched.schedule(request)
    if decision.node is None:
        result.failed = f"FailedScheduling: {decision.message}"
        return result
    result.node = sched.cluster.names[decision.node]
    owner_prefix = f"{meta['namespace']}/{meta['name']}"
    for container, devices in request.container_devices:
        for resource, size in devices.items():
            try:
                allocated = await kubelet.allocate(resource, size, f"{owner_prefix}/{container}")
            except kubelet_.AdmissionError as exc:
                kubelet.release(f"{owner_prefix}/{container}")
                result.failed = f"kubelet admission failed: {exc}"
                return result
            envs = dict(allocated.container_responses[0].envs)
            result.gpus, result.where = _placement(node, envs.get(contract_.ENV_VISIBLE_DEVICES, ""))
            result.memory_mib = int(envs.get(contract_.ENV_MEMORY_LIMIT_MIB, "0"))
            result.env = {k: envs[k] for k in _SHOWN_ENV if k in envs}
    sched.cluster.bind(decision.node, request)
    labels_now = _labels_now(node, contract, kubelet)
    sched.cluster.set_labels(decision.node, labels_now)
    view.update_node(NODE_NAME, labels_now)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuslice-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--node-file", help="simulated node (default: the embedded demo-node.yaml)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    config.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = config.from_args(args)
        if args.node_file:
            node = nodefile.load(args.node_file)
        else:
            with importlib.resources.as_file(
                importlib.resources.files("gpuslice") / "examples" / "demo-node.yaml"
            ) as path:
                node = nodefile.load(path)
    except (config.ConfigError, nodefile.NodeFileError) as exc:
        print(f"gpuslice-demo: {exc}", file=sys.stderr)
        return 2
    report = asyncio.run(run_demo(settings, node))
    print(json.dumps(dataclasses.asdict(report), indent=2) if args.json else report.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
