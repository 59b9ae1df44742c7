"""The steering labels in DRA mode: the device plugin's labeller (node/labeller.py: diff,
rate limit, backoff, labels withdrawn at exit) with what is in use
read from the claims this plugin prepared instead of kubelet's PodResources record.

Why labels at all in DRA mode: the scheduler's DRA allocator guarantees that shares fit one GPU,
but it does not score devices or nodes by what is left on them, so without steering a burst
spreads over every node and fragments the GPUs (docs/benchmarks.md, "DRA mode and device-plugin
mode"). With the same labels as in device-plugin mode the webhook adds the same preferred node
affinity, and the stock scheduler packs.

What is counted: every prepared share's memory, rounded up to whole units, on its GPU; MIG devices
by UUID. A claim the scheduler has allocated but kubelet has not yet asked us to prepare is not
seen, as in device-plugin mode an allocation is seen only at Allocate; the webhook's promises
cover that gap.

May import gpuslice.{config,contract}, gpuslice.node (labeller, labels, inventory, health)
and gpuslice.dra.shares.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from gpuslice.dra import shares as shares_
from gpuslice.node import health, labeller, labels

__all__ = ["ClaimLabeller", "in_use"]

InUse = tuple[Counter[str], set[str]]  # memory units by GPU UUID, MIG device UUIDs


def in_use(prepared: Iterable[shares_.Share], unit_mib: int) -> InUse:
    """(units by GPU UUID, MIG UUIDs) held by these shares."""
    units: Counter[str] = Counter()
    mig: set[str] = set()
    for share in prepared:
        if share.is_mig:
            mig.add(share.uuid)
        else:
            units[share.gpu_uuid] += -(-share.memory_mib // unit_mib)  # a partial unit is taken
    return units, mig


class ClaimLabeller(labeller.NodeLabeller):
    """`usage()` gives what is in use now (`in_use` of the prepared shares); call `notify()` when
    it changes."""

    # Every write waits for the rate limit's slot, what pods take included: the allocator, not the
    # labels, decides what fits, so labels that promise too much cost a pod nothing (labels 5 s
    # behind moved no packing: docs/dra.md), while every Node write runs the scheduler's queueing
    # hints for each waiting pod (docs/benchmarks.md, "DRA mode and device-plugin mode").
    takes_at_once = False

    def __init__(self, usage: Callable[[], InUse], **kwargs: Any) -> None:
        # The PodResources socket is never dialled: _refresh below is the only reader.
        super().__init__(pod_resources_socket="/nonexistent/pod-resources.sock", **kwargs)
        self._in_use = usage

    async def _refresh(self, client: Any) -> None:
        units, mig = self._in_use()
        sick = set(self._unhealthy()) if self._unhealthy is not None else set()
        if sick:  # an unhealthy GPU must not look free (its ResourceSlice device is tainted too)
            every = health.ALL in sick
            for gpu in self._node.memory_gpus:
                if every or gpu.uuid in sick:
                    units[gpu.uuid] = self._contract.units_per_gpu(gpu.memory_mib)
            mig |= {m.uuid for m in self._node.mig_devices() if every or m.uuid in sick or m.parent_uuid in sick}
        self.desired = labels.node_labels(
            self._node,
            self._contract,
            allocated=units,
            allocated_mig=mig,
            headroom=await self._headroom(),
            cpu_per_gpu_milli=self._cpu_per_gpu,  # the CPU balance labels, as in device-plugin mode
        )
