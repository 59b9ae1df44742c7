"""Memory-aware placement score (issue 6): how much real free memory and idle time the node's
shared GPUs have, as NVML measures them, published as the `gpu.placement-score` label (0..100).

Formula (docs/steering.md explains the choices), for each shared (non-MIG) GPU g:

    s_g = (1 - m_g) * (1 - b_g)      m_g = used / total memory, b_g = utilisation / 100

except that a GPU under real memory pressure (the usage monitor finds its processes using more than
kubelet's grants account for: over-use, or processes gpuslice does not know; issue 15) scores 0:
the units kubelet still offers there are not really free. Each s_g is smoothed by a time-based
EWMA (time constant `tau_seconds`) so that one spike does not move the label; the node score is
the capacity-weighted mean of the smoothed s_g, i.e. the share of the node's GPU memory that is
both really free and really idle. The published integer is quantised to `step` with hysteresis
(it changes only when the smoothed score has moved 3/4 of a step away from what is published),
which bounds label churn.

Reads NVML only through a `read(uuid) -> (used MiB, total MiB, util % or None)` function
(production: `nvml_source.read_usage` bound to pynvml). May import gpuslice.node.inventory
and gpuslice.node.nvml_source; nothing else of gpuslice.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Collection

from gpuslice.node import inventory, nvml_source

__all__ = ["PlacementScore", "Reader", "from_nvml", "gpu_score"]

log = logging.getLogger(__name__)

Reader = Callable[[str], tuple[int, int, int | None]]

DEFAULT_TAU_SECONDS = 60.0
DEFAULT_STEP = 10
# The published value moves once the smoothed score is 3/4 of a step away from it: noise of up to
# a quarter step around a bucket boundary cannot flap the label, and the label is never more than
# 3/4 of a step from the truth.
_HYSTERESIS = 0.75


def gpu_score(used_mib: int, total_mib: int, util_percent: int | None) -> float:
    """(1 - memory use) * (1 - busy time), 0..1, from one NVML reading; utilisation unknown
    (None) counts as idle so the score falls back to memory alone."""
    if total_mib <= 0:
        raise ValueError(f"GPU total memory must be positive, got {total_mib} MiB")
    memory_free = 1.0 - min(1.0, max(0.0, used_mib / total_mib))
    idle = 1.0 - min(1.0, max(0.0, (util_percent or 0) / 100.0))
    return memory_free * idle


@dataclasses.dataclass
class _Smoothed:
    value: float
    at: float  # monotonic seconds of the last sample
    total_mib: int


class PlacementScore:
    """Callable as the labeller's `usage`: samples every shared GPU, returns the score or None
    (no GPU could be read: the label is then removed rather than left stale)."""

    def __init__(
        self,
        *,
        node: inventory.NodeInventory,
        read: Reader,
        tau_seconds: float = DEFAULT_TAU_SECONDS,
        step: int = DEFAULT_STEP,
        clock: Callable[[], float] = time.monotonic,
        pressured: Callable[[], Collection[str]] | None = None,
    ) -> None:
        if tau_seconds <= 0 or not 1 <= step <= 100:
            raise ValueError(f"tau_seconds must be > 0 and step in 1..100, got {tau_seconds} and {step}")
        self._uuids = tuple(g.uuid for g in node.memory_gpus)
        self._read = read
        self._tau = tau_seconds
        self._step = step
        self._clock = clock
        self._pressured = pressured
        self._smoothed: dict[str, _Smoothed] = {}
        self._published: int | None = None

    def sample(self) -> None:
        """Read every shared GPU once and fold the reading into its EWMA."""
        now = self._clock()
        pressured = self._pressured() if self._pressured is not None else ()
        for uuid in self._uuids:
            try:
                used, total, util = self._read(uuid)
                value = 0.0 if uuid in pressured else gpu_score(used, total, util)
            except Exception as exc:  # noqa: BLE001 - per GPU: keep the others' readings
                log.debug("placement: cannot read usage of %s: %s", uuid, exc)
                continue
            previous = self._smoothed.get(uuid)
            if previous is None:
                self._smoothed[uuid] = _Smoothed(value, now, total)
                continue
            # Time-based EWMA: the same smoothing whatever the sampling interval.
            alpha = 1.0 - math.exp(-max(0.0, now - previous.at) / self._tau)
            previous.value += alpha * (value - previous.value)
            previous.at = now
            previous.total_mib = total

    def raw(self) -> float | None:
        """Capacity-weighted mean of the smoothed per-GPU scores, 0..100, or None."""
        capacity = sum(s.total_mib for s in self._smoothed.values())
        if not capacity:
            return None
        return 100.0 * sum(s.value * s.total_mib for s in self._smoothed.values()) / capacity

    def published(self) -> int | None:
        """The quantised score with hysteresis (moves only 3/4 of a step away from the last one)."""
        raw = self.raw()
        if raw is None:
            self._published = None
        elif self._published is None or abs(raw - self._published) >= _HYSTERESIS * self._step:
            self._published = min(100, max(0, round(raw / self._step) * self._step))
        return self._published

    def __call__(self) -> int | None:
        self.sample()
        return self.published()


def from_nvml(
    node: inventory.NodeInventory,
    nvml: nvml_source.Nvml,
    *,
    tau_seconds: float = DEFAULT_TAU_SECONDS,
    step: int = DEFAULT_STEP,
    pressured: Callable[[], Collection[str]] | None = None,
) -> PlacementScore:
    """The production scorer: readings through `nvml_source.read_usage` on an initialised NVML;
    `pressured` (the usage monitor's) names the GPUs under real memory pressure."""
    read = functools.partial(nvml_source.read_usage, nvml)
    return PlacementScore(node=node, read=read, tau_seconds=tau_seconds, step=step, pressured=pressured)
