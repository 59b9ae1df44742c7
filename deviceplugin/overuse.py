"""Over-use: a container using more GPU memory than its grant, and what the policy does about it.

`Detector` turns snapshots into over-uses. A container is *over* while the memory its processes
hold on a device exceeds its grant there by more than `monitor.overuseToleranceMiB`; it becomes
an over-use once it has stayed over for `monitor.overuseSeconds` (one sample over a line is not
enough: allocators breathe). The episode ends at the first sample back within the grant, or when
the container or the device's figures disappear (no data is never a reason to act). MIG devices
are never over: the hardware bounds them.

`Enforcer` applies `monitor.overusePolicy` to every over-use that is due:

* `warn` (default): a Warning Event `GPUMemoryOverUse` on the pod naming the container, the GPU,
  the use and the grant, once per episode;
* `evict`: the same Event plus an eviction through the Eviction API (PodDisruptionBudgets hold;
  a refused eviction is retried every `overuseSeconds` while the over-use lasts);
* `kill`: the same Event plus SIGKILL to the container's largest process on that GPU, only if the
  PID still names the process that was measured (deviceplugin/killer.py); if the container is
  still over `overuseSeconds` later, its next largest process goes.

A failed Event or eviction is counted and logged, and tried again at the next due time; it never
stops the monitor. Counters go to the plugin's registry. May import gpuslice.config and
gpuslice.deviceplugin.{attribution,cgroups,inventory,killer,podapi}.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

import prometheus_client

from gpuslice import config as config_
from gpuslice.deviceplugin import attribution, cgroups, killer, podapi
from gpuslice.node import inventory

__all__ = ["REASON", "Detector", "Enforcer", "OverUse"]

log = logging.getLogger(__name__)

REASON = "GPUMemoryOverUse"

Key = tuple[str, str, str, str]


@dataclasses.dataclass(frozen=True)
class OverUse:
    use: attribution.ContainerUse
    over_seconds: float  # how long it has been over
    first_action: bool  # no action was taken in this episode yet


@dataclasses.dataclass
class _Episode:
    since: float
    acted_at: float | None = None


class Detector:
    """Tracks every container's episode above its grant; `update` returns the over-uses due now."""

    def __init__(self, *, tolerance_mib: int, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.tolerance_mib = tolerance_mib
        self.seconds = seconds
        self._clock = clock
        self._episodes: dict[Key, _Episode] = {}

    def is_over(self, use: attribution.ContainerUse) -> bool:
        return not use.mig and use.used_mib > use.granted_mib + self.tolerance_mib

    @property
    def over(self) -> frozenset[Key]:
        """Containers over their grant now (whether or not for long enough)."""
        return frozenset(self._episodes)

    def update(self, snapshot: attribution.Snapshot) -> list[OverUse]:
        now = self._clock()
        due = []
        seen = set()
        for use in snapshot.containers:
            if not self.is_over(use):
                continue
            seen.add(use.key)
            episode = self._episodes.setdefault(use.key, _Episode(since=now))
            waited_since = episode.since if episode.acted_at is None else episode.acted_at
            if now - waited_since >= self.seconds:
                due.append(OverUse(use, now - episode.since, first_action=episode.acted_at is None))
        for key in set(self._episodes) - seen:
            episode = self._episodes.pop(key)
            if episode.acted_at is not None:
                log.info("%s/%s is back within its GPU memory grant on %s", key[0], key[1], key[2])
        return due

    def acted(self, key: Key) -> None:
        """An action was taken for this episode: the next one waits another `seconds`."""
        episode = self._episodes.get(key)
        if episode is not None:
            episode.acted_at = self._clock()


class Enforcer:
    """Applies the over-use policy: Events through `api`, evictions through `api`, kills through `kill`."""

    def __init__(
        self,
        *,
        settings: config_.MonitorConfig,
        node: inventory.NodeInventory,
        node_name: str,
        api: podapi.PodApi | None,
        proc_root: str = "/proc",
        registry: prometheus_client.CollectorRegistry | None = None,
        kill: Callable[[cgroups.Identity, str], killer.KillResult] = killer.kill_if_same,
    ) -> None:
        self.policy = settings.overuse_policy
        self._tolerance = settings.overuse_tolerance_mib
        self._seconds = settings.overuse_seconds
        self._node = node
        self._node_name = node_name
        self._api = api
        self._proc_root = proc_root
        self._kill = kill
        self._blocked_reported: set[Key] = set()
        self._counter = (
            prometheus_client.Counter(
                "gpuslice_gpu_overuse_actions",
                "Actions on GPU memory over-use, by policy, action (event, evict, kill) and result",
                ["policy", "action", "result"],
                registry=registry,
            )
            if registry is not None
            else None
        )
        if self.policy == "kill" and not killer.in_host_pid_namespace(proc_root):
            log.error(
                "monitor.overusePolicy is kill, but %s is not this process's PID namespace: the PIDs NVML "
                "reports cannot be signalled from here (run the plugin with hostPID). Falling back to warn.",
                proc_root,
            )
            self.policy = "warn"

    async def handle(self, due: list[OverUse], detector: Detector) -> None:
        for overuse in due:
            if overuse.first_action:
                self._blocked_reported.discard(overuse.use.key)
            if self.policy == "warn" and not overuse.first_action:
                continue
            outcome = await self._act(overuse)
            delivered = outcome is not None and await self._event(overuse.use, self._message(overuse, outcome))
            if delivered or self.policy != "warn":
                # warn's only action is the Event: an undelivered one is tried again next round
                detector.acted(overuse.use.key)

    async def _act(self, overuse: OverUse) -> str | None:
        """Apply the policy; the outcome for the Event, or None when no Event should be sent."""
        use = overuse.use
        if self.policy == "warn":
            return "policy warn: nothing else is done (monitor.overusePolicy)"
        if self.policy == "evict":
            return await self._evict(use)
        return await self._kill_largest(use)

    async def _evict(self, use: attribution.ContainerUse) -> str | None:
        if self._api is None or not use.pod_uid:
            self._count("evict", "failed")
            return "policy evict: the pod cannot be evicted (no API server connection or pod UID)"
        try:
            result = await self._api.evict(use.namespace, use.pod, use.pod_uid)
        except podapi.PodApiError as exc:
            self._count("evict", "failed")
            log.warning("eviction of %s/%s failed: %s (retrying in %.0fs)", use.namespace, use.pod, exc, self._seconds)
            return None
        self._count("evict", result.value)
        if result is podapi.EvictionResult.EVICTED:
            log.warning("evicted %s/%s for GPU memory over-use on %s", use.namespace, use.pod, use.device)
            return "policy evict: the pod is being evicted"
        if result is podapi.EvictionResult.BLOCKED:
            log.warning(
                "eviction of %s/%s refused by a PodDisruptionBudget; retrying in %.0fs",
                use.namespace,
                use.pod,
                self._seconds,
            )
            if use.key in self._blocked_reported:
                return None
            self._blocked_reported.add(use.key)
            return f"policy evict: a PodDisruptionBudget refuses the eviction now; retried every {self._seconds:g}s"
        return None  # gone: nothing to say to a pod that no longer exists

    async def _kill_largest(self, use: attribution.ContainerUse) -> str | None:
        candidates = sorted(use.processes, key=lambda p: -(p.used_mib or 0))
        for process in candidates:
            result = await asyncio.to_thread(self._kill, process.identity, self._proc_root)
            self._count("kill", result.value)
            if result is killer.KillResult.KILLED:
                log.warning(
                    "killed process %d of %s/%s/%s (%s MiB on %s) for GPU memory over-use",
                    process.pid,
                    use.namespace,
                    use.pod,
                    use.container,
                    process.used_mib,
                    use.device,
                )
                return f"policy kill: process {process.pid} ({_mib(process.used_mib)} on this GPU) was killed"
            if result is killer.KillResult.REFUSED:
                log.error("cannot kill process %d: no permission (the kill policy needs CAP_KILL)", process.pid)
                return f"policy kill: process {process.pid} could not be killed (no permission)"
            # GONE or CHANGED: the measured process is not there any more; try the next one
        return None

    async def _event(self, use: attribution.ContainerUse, message: str) -> bool:
        """Post the Event; False when it could not be."""
        if self._api is None or not use.pod_uid:
            self._count("event", "failed")
            log.warning(
                "GPU memory over-use of %s/%s/%s (no Event: %s): %s",
                use.namespace,
                use.pod,
                use.container,
                "no API server connection" if self._api is None else "pod UID unknown",
                message,
            )
            return False
        event = podapi.PodEvent(
            namespace=use.namespace,
            pod=use.pod,
            pod_uid=use.pod_uid,
            container=use.container,
            reason=REASON,
            message=message,
        )
        try:
            await self._api.create_event(event, self._node_name)
        except podapi.PodApiError as exc:
            self._count("event", "failed")
            log.warning("Event on %s/%s not written: %s; it said: %s", use.namespace, use.pod, exc, message)
            return False
        self._count("event", "ok")
        log.warning("%s/%s: %s", use.namespace, use.pod, message)
        return True

    def _message(self, overuse: OverUse, outcome: str) -> str:
        use = overuse.use
        try:
            gpu = self._node.gpu(use.gpu)
            where = f"{use.gpu} (index {gpu.index}, {gpu.model})"
        except KeyError:
            where = use.gpu
        partial = "" if use.used_complete else " at least"
        return (
            f"container {use.container} uses{partial} {use.used_mib} MiB of GPU memory on {where}, more than its "
            f"grant of {use.granted_mib} MiB (tolerance {self._tolerance} MiB) for {overuse.over_seconds:.3g}s; "
            f"{outcome}"
        )

    def _count(self, action: str, result: str) -> None:
        if self._counter is not None:
            self._counter.labels(self.policy, action, result).inc()


def _mib(value: int | None) -> str:
    return "unknown MiB" if value is None else f"{value} MiB"
