"""The node side of the replay on the real control plane (`gpuslice-sim --scheduler kube`): for every
trace node, what kubelet and the gpuslice device plugin do between the binding and a running pod.

There is no kubelet (no container runtime), so this plays each node's part, in one process:
- the Node objects, as kubelet and the plugin register them: allocatable CPU, memory and the
  plugin's extended resources, the plugin's labels (`node.labels`), Ready;
- one watch of every pod bound to a node: kubelet's admission of the pod through the simulated
  device manager and the plugin's real allocation policy (`sim.node.SimNode.admit`), then the pod's
  status as kubelet writes it: Running, or Failed with reason UnexpectedAdmissionError;
- per node, the plugin's real labeller (`node.labeller.NodeLabeller`: recompute, diff,
  rate limit of `steering.labelMinIntervalSeconds`, merge patch) writing to the real API server.
  Only its two reads are replaced: kubelet's PodResources record by the simulated node's, and the
  node's CPU/memory headroom (GET node + list its pods) by this process's own record of the same
  pods, which saves two requests per refresh and gives the same figures.

In DRA mode (`dra=True`) the nodes offer no extended resources: each publishes ResourceSlices
(sim/kube_dra.py), and a bound pod's grant is read from its allocated claims instead of the
simulated device manager; kubelet has nothing left to refuse. Each node's DRA plugin labeller
(dra/labeller.py) counts the claims as its plugin would once prepared.

May import aiohttp (through sim.kube_api), gpuslice.config/contract, gpuslice.deviceplugin, gpuslice.dra
(labeller, slices: the DRA plugin's node side), gpuslice.node (labeller, inventory) and the other
gpuslice.sim modules.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuslice import config
from gpuslice import contract as contract_
from gpuslice.dra import labeller as dra_labeller
from gpuslice.dra import slices
from gpuslice.node import inventory, labeller
from gpuslice.sim import kube_api, kube_dra, scheduler, trace
from gpuslice.sim import node as node_

__all__ = ["Decision", "Fleet"]

log = logging.getLogger(__name__)

_MIB = 2**20
_POD_CAPACITY = "10000"  # the model has no pod-count limit; kubelet's default 110 would be one


@dataclasses.dataclass(frozen=True)
class Decision:
    """What kubelet decided for one bound pod."""

    pod: str  # namespace/name
    node: str
    admitted: bool
    message: str
    granted: float = 0.0  # GPUs' worth of memory kubelet granted (SimNode.credit), the headline's unit
    shares: tuple[node_.GpuShare, ...] = ()  # per GPU, what the grant holds (--placements)
    # DRA mode, per device of the pod's claims: the request (and subrequest) it was allocated for,
    # "gpu/m16384", and which alternative of its request's prioritized list that is (0: the first;
    # also 0 without a list). --placements: which class a pod fell back to.
    claim_requests: tuple[str, ...] = ()
    claim_alternatives: tuple[int, ...] = ()


def _alternative(claim: Mapping[str, Any], allocated_for: str) -> int:
    """The position of subrequest "gpu/m16384" in its request's prioritized list (0 without one)."""
    name, _, sub = allocated_for.partition("/")
    for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or ():
        if request.get("name") == name:
            names = [a.get("name") for a in request.get("firstAvailable") or ()]
            return names.index(sub) if sub in names else 0
    return 0


class _NodeApi:
    """The labeller's NodeApi: patches to the real API server, headroom from the fleet's record."""

    def __init__(self, api: kube_api.Api, fleet: Fleet) -> None:
        self._api = api
        self._fleet = fleet

    async def patch_labels(self, node_name: str, labels: dict[str, str | None]) -> None:
        try:
            await self._api.merge_patch(f"/api/v1/nodes/{node_name}", {"metadata": {"labels": labels}})
        except (kube_api.ApiError, OSError, TimeoutError) as exc:
            raise labeller.NodeApiError(f"PATCH node {node_name}: {exc}") from None
        self._fleet.label_writes += 1

    async def headroom(self, node_name: str) -> tuple[int, int]:
        return self._fleet.headroom(node_name)


class _Labeller(labeller.NodeLabeller):
    """The plugin's labeller with kubelet's PodResources record read from the simulated node."""

    def __init__(self, sim: node_.SimNode, **kwargs: Any) -> None:
        # The socket is never dialled: _refresh below is the only reader of kubelet's record.
        super().__init__(pod_resources_socket="/nonexistent/kubelet.sock", **kwargs)
        self._sim = sim

    async def _refresh(self, client: Any) -> None:
        self.desired = self._sim.labels(steering=True, headroom=await self._headroom())


class Fleet:
    """Every trace node's kubelet and device plugin against one API server."""

    def __init__(
        self,
        api: kube_api.Api,
        nodes: Sequence[trace.TraceNode],
        settings: config.Config,
        *,
        sharing: bool,
        namespace: str,
        gpu_memory_mib: Mapping[str, int] = trace.GPU_MEMORY_MIB,
        status_writers: int = 16,
        dra: bool = False,
        prepare_seconds: float = 0.0,
    ) -> None:
        self.api = api
        self.settings = settings
        self.contract = settings.contract
        self.sharing = sharing
        self.dra = dra and sharing
        # DRA mode: how long after a pod is bound kubelet prepares its claims (its pod sync), and
        # the node's plugin, whose labels count prepared claims, first counts them.
        self.prepare_seconds = prepare_seconds
        self.steering = settings.steering.enabled and sharing
        self.namespace = namespace
        self.trace_nodes = {n.name: n for n in nodes}
        self.sims = {
            n.name: node_.SimNode(
                n.name,
                trace.node_inventory(n, gpu_memory_mib),
                self.contract,
                sharing=sharing,
                cpu_per_gpu_milli=settings.steering.cpu_per_gpu_milli,
            )
            for n in nodes
        }
        self.requested = {n.name: [0, 0] for n in nodes}  # CPU milli, memory bytes of pods holding resources
        self.decisions: dict[str, Decision] = {}  # pod key -> kubelet's latest decision
        # A refused pod the webhook's requeuer recreated comes back under its name with a new UID,
        # and is admitted again; `refusals` counts every refusal, `decisions` keeps the last.
        self._decided_uid: dict[str, str] = {}
        self.refusals = 0
        self.listeners: list[Callable[[Decision], None]] = []
        self.errors: list[str] = []
        self.label_writes = 0
        self._status: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._status_writers = status_writers
        self._labellers: dict[str, labeller.NodeLabeller] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.ledger = kube_dra.DeviceLedger(self.contract)
        self._claim_reads: set[asyncio.Task[None]] = set()

    # --- what the nodes look like ----------------------------------------------------------

    def headroom(self, name: str) -> tuple[int, int]:
        node = self.trace_nodes[name]
        cpu, memory = self.requested[name]
        return max(0, node.cpu_milli - cpu), max(0, (node.memory_mib * _MIB - memory) // _MIB)

    def labels(self, name: str) -> dict[str, str]:
        sim = self.sims[name]
        return {"kubernetes.io/hostname": name, **sim.labels(steering=self.steering, headroom=self.headroom(name))}

    def gpu_in_use(self, name: str, gpu: inventory.Gpu) -> bool:
        """Whether node `name`'s `gpu` holds a pod's devices: in DRA mode whether an allocation
        consumed some of it (the simulated device manager grants nothing there), else whether the
        device manager granted units of it or all of it."""
        if self.dra:
            return self.ledger.consumed.get((name, slices.device_name(gpu)), 0.0) > 0
        sim = self.sims[name]
        return bool(sim.units_in_use.get(gpu.uuid)) or gpu.uuid in sim.whole_in_use

    def gpus_in_use(self) -> int:
        """GPUs holding at least one pod's devices (in device-plugin mode MIG parents too)."""
        if self.dra:
            return sum(self.gpu_in_use(n, g) for n, sim in self.sims.items() for g in sim.node.memory_gpus)
        return sum(s.gpus_in_use() for s in self.sims.values())

    def node_object(self, name: str) -> dict[str, Any]:
        """The Node as kubelet registers it with the plugin's resources and labels; no addresses."""
        node = self.trace_nodes[name]
        resources = {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": _POD_CAPACITY}
        if not self.dra:
            resources.update({r: str(n) for r, n in self.sims[name].allocatable().items()})
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": self.labels(name)},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "gpuslice-sim"}
                ],
            },
        }

    async def create_nodes(self, concurrency: int = 32) -> None:
        gate = asyncio.Semaphore(concurrency)

        async def create(name: str) -> None:
            async with gate:
                await self.api.create("/api/v1/nodes", self.node_object(name))

        await asyncio.gather(*(create(name) for name in self.trace_nodes))
        if self.dra:
            for device_class in kube_dra.device_classes(self.contract):
                await self.api.create(kube_dra.DEVICE_CLASSES_PATH, device_class)
            objects = [o for n, sim in self.sims.items() for o in kube_dra.node_slices(sim.node, self.contract, n)]
            self.ledger.add_slices(objects)

            async def publish(obj: dict[str, Any]) -> None:
                async with gate:
                    await self.api.create(kube_dra.SLICES_PATH, obj)

            await asyncio.gather(*(publish(o) for o in objects))

    # --- running ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the labellers, the status writers and the watch of bound pods."""
        if self.steering:
            node_api = _NodeApi(self.api, self)
            for name, sim in self.sims.items():
                if not sim.node.gpus:
                    continue
                one: labeller.NodeLabeller
                if self.dra:
                    usage = self._dra_usage(name, sim)
                    one = dra_labeller.ClaimLabeller(
                        usage, node=sim.node, settings=self.settings, node_name=name, api=node_api
                    )
                else:
                    one = _Labeller(sim, node=sim.node, settings=self.settings, node_name=name, api=node_api)
                # The Node was created with these labels: the plugin has been running before the replay.
                one.written = {k: v for k, v in self.labels(name).items() if k != "kubernetes.io/hostname"}
                self._labellers[name] = one
                self._tasks.append(asyncio.create_task(one.run(), name=f"labeller-{name}"))
        for i in range(self._status_writers):
            self._tasks.append(asyncio.create_task(self._write_status(), name=f"status-writer-{i}"))
        self._tasks.append(
            asyncio.create_task(
                kube_api.follow(
                    self.api,
                    f"/api/v1/namespaces/{self.namespace}/pods",
                    self._on_event,
                    params={"fieldSelector": "spec.nodeName!="},
                ),
                name="bound-pods-watch",
            )
        )

    async def settle(self) -> None:
        """Until every status decided so far is written."""
        await self._status.join()

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._claim_reads]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    def failed_tasks(self) -> list[str]:
        """Background tasks that ended with an error (a broken watch, a crashed labeller)."""
        out = []
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                out.append(f"{task.get_name()}: {task.exception()!r}")
        return out

    def _dra_usage(self, name: str, sim: node_.SimNode) -> Callable[[], dra_labeller.InUse]:
        """What this node's DRA plugin would count from the claims it prepared: the ledger's."""
        unit = self.contract.unit_mib
        devices = {(name, slices.device_name(g)): g.uuid for g in sim.node.memory_gpus}

        def usage() -> dra_labeller.InUse:
            units: collections.Counter[str] = collections.Counter()
            for key, uuid in devices.items():
                units[uuid] = -(-round(self.ledger.consumed.get(key, 0.0)) // unit)
            return units, set()

        return usage

    # --- kubelet's pod loop -------------------------------------------------------------------

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            return  # pods never leave in the replay
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        node = (pod.get("spec") or {}).get("nodeName")
        uid = str(meta.get("uid") or "")
        if (
            not node
            or self._decided_uid.get(key) == uid
            or (pod.get("status") or {}).get("phase") not in (None, "Pending")
        ):
            return
        sim = self.sims.get(node)
        if sim is None:
            self.errors.append(f"{key} bound to unknown node {node}")
            return
        self._decided_uid[key] = uid
        if self.dra:
            task = asyncio.create_task(self._admit_dra(key, node, pod), name=f"claims-of-{key}")
            self._claim_reads.add(task)
            task.add_done_callback(self._claim_reads.discard)
            return
        self._decide(key, node, pod, self._admit(key, node, sim, pod))

    def _decide(self, key: str, node: str, pod: dict[str, Any], decision: Decision) -> None:
        meta = pod["metadata"]
        self.decisions[key] = decision
        if not decision.admitted:
            self.refusals += 1
        if decision.admitted:
            patch = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
        else:
            patch = {
                "status": {"phase": "Failed", "reason": contract_.KUBELET_REFUSED_REASON, "message": decision.message}
            }
        self._status.put_nowait((f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", patch))
        for listener in self.listeners:
            listener(decision)

    def _admit(self, key: str, node: str, sim: node_.SimNode, pod: dict[str, Any]) -> Decision:
        try:
            request = scheduler.read_pod(pod)
        except ValueError as exc:
            return Decision(key, node, False, f"unreadable pod: {exc}")
        try:
            grants = sim.admit(key, request.container_devices)
        except node_.AdmissionFailure as exc:
            return Decision(key, node, False, f"Allocate failed due to {exc}")
        granted = sim.credit(grants)
        held = self.requested[node]
        held[0] += int(request.requests.get(scheduler.CPU, 0))
        held[1] += int(request.requests.get(scheduler.MEMORY, 0))
        one = self._labellers.get(node)
        if one is not None:
            one.notify()  # the plugin's Allocate notifies its labeller
        shares = tuple(share for grant in grants for share in grant.shares)
        return Decision(key, node, True, "", granted, shares)

    async def _admit_dra(self, key: str, node: str, pod: dict[str, Any]) -> None:
        """Kubelet's side in DRA mode: the pod runs; its grant is what its claims were allocated."""
        if self.prepare_seconds:
            await asyncio.sleep(self.prepare_seconds)
        granted = 0.0
        shares: list[node_.GpuShare] = []
        requests: list[str] = []
        alternatives: list[int] = []
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        try:
            for status in statuses:
                claim = await self.api.request(
                    "GET",
                    f"/apis/resource.k8s.io/v1/namespaces/{pod['metadata']['namespace']}"
                    f"/resourceclaims/{status['resourceClaimName']}",
                )
                pool, share, claimed = self.ledger.grant(claim)
                if pool != node:
                    self.errors.append(f"{key} bound to {node}, its claim allocated on {pool}")
                granted += share
                shares.extend(claimed)
                for result in claim["status"]["allocation"]["devices"]["results"]:
                    requests.append(str(result.get("request", "")))
                    alternatives.append(_alternative(claim, requests[-1]))
        except (kube_api.ApiError, OSError, TimeoutError, ValueError, KeyError) as exc:
            self.errors.append(f"claims of {key}: {exc!r}")
        try:
            request = scheduler.read_pod(pod)
        except ValueError as exc:
            self.errors.append(f"{key}: unreadable pod: {exc}")
        else:
            held = self.requested[node]
            held[0] += int(request.requests.get(scheduler.CPU, 0))
            held[1] += int(request.requests.get(scheduler.MEMORY, 0))
        one = self._labellers.get(node)
        if one is not None:
            one.notify()  # the plugin prepared the claim: its labeller counts it
        decision = Decision(key, node, True, "", granted, tuple(shares), tuple(requests), tuple(alternatives))
        self._decide(key, node, pod, decision)

    async def _write_status(self) -> None:
        while True:
            path, patch = await self._status.get()
            try:
                await self.api.merge_patch(path, patch)
            except (kube_api.ApiError, OSError, TimeoutError) as exc:
                self.errors.append(f"status of {path}: {exc}")
            finally:
                self._status.task_done()
