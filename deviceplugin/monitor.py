"""The usage monitor's loop: every `monitor.intervalSeconds`, what each pod really uses on the
node's GPUs, over-use detection and policy, and memory pressure for the placement score.

One round:

1. NVML, per shared device (GPUs not in MIG mode, MIG devices): memory, utilisation, processes
   (deviceplugin/gpu_usage.py), in a worker thread;
2. /proc under `proc_root`, per process PID: start time and cgroup -> pod UID and container ID
   (deviceplugin/cgroups.py);
3. kubelet's PodResources List: which container holds which units or MIG devices;
4. the API server's list of the node's pods (UID -> name, container ID -> container name), read
   again when a process names a pod or container it did not list (at most every
   `_RELIST_MIN_SECONDS`) and at the latest every `_POD_LIST_MAX_AGE_SECONDS`, so a pod deleted
   and re-created under the same name is never confused with its predecessor for long;
5. the join (deviceplugin/attribution.py) into a snapshot, which the metrics render at scrape
   time (deviceplugin/usage_metrics.py); over-use detection and policy (deviceplugin/overuse.py).

A round whose PodResources read fails leaves the previous snapshot in place (grants unknown: no
figure and no action is better than a wrong one); a device NVML cannot read is reported down and
its containers are left out; a failing pod list keeps the last one. Nothing here stops the plugin.

May import gpuslice.config and gpuslice.deviceplugin.{attribution,cgroups,gpu_usage,inventory,
nvml_source,overuse,podapi,podresources,usage_metrics,killer}.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import prometheus_client

from gpuslice import config as config_
from gpuslice.deviceplugin import attribution, cgroups, gpu_usage, killer, overuse, podapi, usage_metrics
from gpuslice.node import inventory, nvml_source, podresources

__all__ = ["UsageMonitor"]

log = logging.getLogger(__name__)

_RELIST_MIN_SECONDS = 30.0
_POD_LIST_MAX_AGE_SECONDS = 120.0


class UsageMonitor:
    """Samples, attributes, detects and enforces; `run()` until cancelled, or `sample_once()`."""

    def __init__(
        self,
        *,
        nvml: nvml_source.Nvml,
        node: inventory.NodeInventory,
        settings: config_.Config,
        node_name: str,
        pod_resources_socket: str,
        proc_root: str = "/proc",
        api: podapi.PodApi | None = None,
        registry: prometheus_client.CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        kill: Callable[[cgroups.Identity, str], killer.KillResult] = killer.kill_if_same,
    ) -> None:
        self._settings = settings.monitor
        self._contract = settings.contract
        self._node = node
        self._node_name = node_name
        self._socket = pod_resources_socket
        self._proc_root = proc_root
        self._clock = clock
        self._own_api = api is None and bool(node_name)
        self._api: podapi.PodApi | None = api if api is not None else (podapi.KubernetesPodApi() if node_name else None)
        self._reader = gpu_usage.UsageReader(nvml, gpu_usage.shared_devices(node))
        self.detector = overuse.Detector(
            tolerance_mib=self._settings.overuse_tolerance_mib, seconds=self._settings.overuse_seconds, clock=clock
        )
        self.enforcer = overuse.Enforcer(
            settings=self._settings,
            node=node,
            node_name=node_name,
            api=self._api,
            proc_root=proc_root,
            registry=registry,
            kill=kill,
        )
        self.snapshot: attribution.Snapshot | None = None
        self._pressured: frozenset[str] = frozenset()
        self._pods: list[podapi.PodInfo] = []
        self._pods_read_at: float | None = None
        self._samples = None
        if registry is not None:
            self._samples = prometheus_client.Counter(
                "gpuslice_gpu_monitor_rounds",
                "Usage monitor rounds, by result (ok, error: kubelet's PodResources or NVML unreadable)",
                ["result"],
                registry=registry,
            )
            usage_metrics.SnapshotCollector(lambda: self.snapshot, lambda: self.detector.over, self.pressured).register(
                registry
            )

    def pressured(self) -> frozenset[str]:
        """GPUs under real memory pressure in the last round (for the placement score)."""
        return self._pressured

    async def run(self) -> None:
        """Until cancelled."""
        client = podresources.Client(self._socket)
        try:
            while True:
                await self.sample_once(client)
                await asyncio.sleep(self._settings.interval_seconds)
        finally:
            await client.close()
            if self._own_api and isinstance(self._api, podapi.KubernetesPodApi):
                self._api.close()

    async def sample_once(self, client: podresources.Client) -> attribution.Snapshot | None:
        """One round; returns the new snapshot, or None when this round could not make one."""
        try:
            # Start times are compared with this: a process started after NVML answered is not
            # the one it listed under that PID.
            asked_at = await asyncio.to_thread(cgroups.uptime_seconds, self._proc_root)
            samples = await asyncio.to_thread(self._reader.read)
            pids = sorted({p.pid for s in samples if s.ok for p in s.processes})
            identities = await asyncio.to_thread(self._identities, pids, asked_at)
            holdings = await client.container_devices(self._contract.is_gpuslice_resource)
        except podresources.PodResourcesError as exc:
            self._count("error")
            log.warning("GPU usage not sampled: %s", exc)
            return None
        except Exception:  # noqa: BLE001 - a driver or /proc surprise must not stop the monitor
            self._count("error")
            log.exception("GPU usage not sampled")
            return None
        await self._refresh_pods(identities.values())
        grants = attribution.grants_of(holdings, self._node, self._contract)
        snapshot = attribution.attribute(samples, identities, self._pods, grants)
        for device in snapshot.devices:
            if not device.ok:
                log.warning("GPU usage of %s unknown this round: %s", device.uuid, device.error)
        self.snapshot = snapshot
        self._pressured = snapshot.pressured(self._settings.overuse_tolerance_mib)
        self._count("ok")
        due = self.detector.update(snapshot)
        if due:
            await self.enforcer.handle(due, self.detector)
        return snapshot

    def _identities(self, pids: Iterable[int], asked_at: float) -> dict[int, cgroups.Identity | None]:
        return {pid: cgroups.read(pid, self._proc_root, started_by=asked_at) for pid in pids}

    async def _refresh_pods(self, identities: Iterable[cgroups.Identity | None]) -> None:
        if self._api is None:
            return
        now = self._clock()
        age = None if self._pods_read_at is None else now - self._pods_read_at
        if age is not None and age < _POD_LIST_MAX_AGE_SECONDS:
            if age < _RELIST_MIN_SECONDS or not self._names_unknown(identities):
                return
        try:
            self._pods = await self._api.node_pods(self._node_name)
        except podapi.PodApiError as exc:
            log.warning("pods of node %s not listed: %s (keeping the last list)", self._node_name, exc)
        self._pods_read_at = now  # a failure waits as long as a success before the next try

    def _names_unknown(self, identities: Iterable[cgroups.Identity | None]) -> bool:
        """A process in a pod or container the last pod list did not have."""
        known: dict[str, set[str]] = {}
        for pod in self._pods:
            known[pod.uid] = set(pod.containers)
            if pod.static_uid:
                known[pod.static_uid] = set(pod.containers)
        for identity in identities:
            ref = identity.container if identity is not None else None
            if ref is None:
                continue
            if ref.pod_uid not in known or (ref.container_id and ref.container_id not in known[ref.pod_uid]):
                return True
        return False

    def _count(self, result: str) -> None:
        if self._samples is not None:
            self._samples.labels(result).inc()
