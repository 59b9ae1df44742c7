"""How much of the CPU that pods ask for goes to pods that ask for no device, as the webhook sees
them admitted: what turns `steering.cpuPodsNearlyFullMiB`'s band on (docs/steering.md, "Nodes with
little GPU memory left first").

The band sends CPU-only pods to the nodes with little GPU memory left, so that the CPU beside
large free shares stays for the sharing pods to come. It pays where CPU-only pods ask for much of
the CPU (the trace with the most of them: +1.1 points) and costs 0.05-0.2 points where they ask
for little and most GPU pods take whole GPUs. The share of CPU they ask separates the two: 38 % on
the first, 14-23 % on the others. So the band is on while that share, over the last few thousand
pods admitted, is above `steering.cpuPodsNearlyFullCpuPercent`.

Counted: pods the webhook mutates (converted GPU pods and steered CPU pods), not dry runs, each
with the CPU the scheduler counts for it (gpuslice/podrequests.py); each webhook replica counts
the pods it answers, and starts again from nothing. Pure; no I/O, no clock.

May import nothing of gpuslice.
"""

from __future__ import annotations

__all__ = ["CpuDemand", "MIN_PODS", "WINDOW_PODS"]

# The share is a mean over about the last WINDOW_PODS pods (each pod's weight decays by
# 1 - 1/WINDOW_PODS per later pod), so it follows a cluster whose work changes within hours, and
# it is not read before MIN_PODS pods: over the trace's orders, the default trace's (22.5 %) stays
# below 25 % on 99 % of its pods and the CPU-heavy trace's (38 %) above it from then on.
WINDOW_PODS = 5000
MIN_PODS = 500
_DECAY = 1.0 - 1.0 / WINDOW_PODS


class CpuDemand:
    """The decayed CPU asked by device-less pods and by all counted pods."""

    __slots__ = ("_cpu_pods", "_all", "pods")

    def __init__(self) -> None:
        self._cpu_pods = 0.0  # millicores, decayed
        self._all = 0.0
        self.pods = 0  # pods counted, at most MIN_PODS (only whether the share may be read)

    def note(self, cpu_milli: int, *, device: bool) -> None:
        """One pod admitted, asking for `cpu_milli`; `device`: it was converted to a GPU share."""
        cpu = float(max(0, cpu_milli))
        self._all = self._all * _DECAY + cpu
        self._cpu_pods *= _DECAY
        if not device:
            self._cpu_pods += cpu
        if self.pods < MIN_PODS:
            self.pods += 1

    @property
    def asked(self) -> tuple[float, float]:
        """(CPU asked by device-less pods, by all counted pods), millicores, decayed."""
        return self._cpu_pods, self._all

    @property
    def share(self) -> float | None:
        """The device-less pods' share of the CPU asked (0-1); None before MIN_PODS pods or while
        no pod asked for any CPU."""
        if self.pods < MIN_PODS or self._all <= 0.0:
            return None
        return self._cpu_pods / self._all

    def above(self, percent: int) -> bool:
        """Whether the share is more than `percent` % (percent 0: always)."""
        if percent <= 0:
            return True
        share = self.share
        return share is not None and share * 100.0 > percent
