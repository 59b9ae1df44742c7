"""Allocation policy: which devices a request should get (GetPreferredAllocation) and whether
the devices kubelet chose may be granted (Allocate). Plain code, no gRPC, no I/O: the plugin's
servicers, the simulator and the demo all call these same functions.

Memory units: kubelet counts `<prefix>/gpu-memory` devices; we keep each pod's units on one
physical GPU (best fit), or give whole GPUs (NVLink-connected first) for a request that is a
whole multiple of a GPU. Kubelet treats preferred allocation as advice, so Allocate checks the
result again and rejects a sub-GPU request whose units span GPUs: better a clear admission
error than a pod that believes it has memory it cannot use.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from gpuslice import contract
from gpuslice.node import inventory

__all__ = ["AllocationError", "MemoryGrant", "MemoryUnits", "MigGrant", "MigSlices"]

# Above this many candidate GPUs, whole-GPU selection is greedy instead of exhaustive.
_EXHAUSTIVE_LIMIT = 16


class AllocationError(Exception):
    """Allocate must fail: the message says why, and reaches the pod's events through kubelet."""


@dataclasses.dataclass(frozen=True)
class MemoryGrant:
    """What a container gets for a set of memory units."""

    gpu_uuids: tuple[str, ...]  # one GPU for a share, several for whole GPUs
    units: int  # units per GPU
    memory_mib: int  # MiB per GPU
    fraction: float  # share of each GPU, 0 < fraction <= 1

    @property
    def whole_gpus(self) -> bool:
        return self.fraction >= 1.0


@dataclasses.dataclass(frozen=True)
class MigGrant:
    mig_uuids: tuple[str, ...]
    profile: str
    memory_mib: int  # per MIG device
    parent_uuids: tuple[str, ...]


class MemoryUnits:
    """The `<prefix>/gpu-memory` devices of one node: which GPU each belongs to."""

    def __init__(self, node: inventory.NodeInventory, unit_mib: int) -> None:
        self.node = node
        self.unit_mib = unit_mib
        self.gpus: tuple[inventory.Gpu, ...] = node.memory_gpus
        self.units_of_gpu: dict[str, int] = {g.uuid: g.memory_mib // unit_mib for g in self.gpus}
        self._order = {g.uuid: g.index for g in self.gpus}
        self.gpu_of: dict[str, str] = {}
        self.index_of: dict[str, int] = {}
        ids: list[str] = []
        for gpu in self.gpus:
            for i in range(self.units_of_gpu[gpu.uuid]):
                device_id = contract.unit_device_id(gpu.uuid, i, unit_mib)
                self.gpu_of[device_id] = gpu.uuid
                self.index_of[device_id] = i
                ids.append(device_id)
        self.device_ids: tuple[str, ...] = tuple(ids)
        self._gpu_order: tuple[str, ...] = tuple(g.uuid for g in self.gpus)  # index order
        self._ids_of_gpu: dict[str, tuple[str, ...]] = {
            g.uuid: tuple(contract.unit_device_id(g.uuid, i, unit_mib) for i in range(self.units_of_gpu[g.uuid]))
            for g in self.gpus
        }
        self._id_sets: dict[str, frozenset[str]] = {g: frozenset(ids) for g, ids in self._ids_of_gpu.items()}

    # --- GetPreferredAllocation ----------------------------------------------------------

    def group(self, device_ids: Iterable[str]) -> dict[str, list[str]]:
        """Known device IDs by GPU UUID (unknown IDs dropped), GPUs in index order."""
        grouped: dict[str, list[str]] = {g.uuid: [] for g in self.gpus}
        gpu_of = self.gpu_of
        for device_id in device_ids:
            gpu = gpu_of.get(device_id)
            if gpu is not None:
                grouped[gpu].append(device_id)
        return {g: ids for g, ids in grouped.items() if ids}

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """The devices kubelet should allocate: `size` IDs from `available` holding `must_include`.

        A request smaller than a GPU goes to the GPU whose free units fit it most tightly
        (best fit, lowest index on ties). A request that is a whole multiple of a GPU's units
        takes fully free GPUs, the set with the most NVLinks between its members. When nothing
        fits, the answer is still `size` IDs (most-free GPUs first) so kubelet's own fallback is
        not worse; Allocate then refuses it with a message that says why.

        Kubelet sends every free device (about 4,500 on an 8-GPU node) on every call, so this
        counts free units per GPU with set intersections (C-level work) and only walks the IDs
        of the GPUs it picks, in unit order (no sorting of the whole list).
        """
        if size <= 0:
            return []
        gpu_of = self.gpu_of
        must = [d for d in dict.fromkeys(must_include) if d in gpu_of]
        free_set = set(available)
        free_set.update(must)  # must_include IDs are part of the available set by definition
        # C-level set intersections per GPU: unknown IDs drop out, no per-ID Python work
        counts = {g: n for g, units in self._id_sets.items() if (n := len(free_set.intersection(units)))}
        must_gpus = {gpu_of[d] for d in must}

        whole = self._whole_gpus(counts, must_gpus, size)
        if whole is not None:
            return whole
        fit = self._best_fit(counts, must_gpus, size)
        if fit is not None:
            return self._take(fit, free_set, must, size)
        return self._spill(counts, free_set, must, size)

    def _free_ids(self, gpu: str, free_set: Collection[str]) -> Iterator[str]:
        """`gpu`'s free unit IDs in unit order."""
        return (d for d in self._ids_of_gpu[gpu] if d in free_set)

    def _whole_gpus(self, counts: Mapping[str, int], must_gpus: set[str], size: int) -> list[str] | None:
        sizes = {self.units_of_gpu[g] for g in counts}
        if len(sizes) != 1:
            sizes = {self.units_of_gpu[g.uuid] for g in self.gpus}
        per_gpu = min(sizes) if sizes else 0
        if per_gpu == 0 or size < per_gpu or size % per_gpu:
            return None
        count = size // per_gpu
        fully_free = [g for g in self._gpu_order if counts.get(g, 0) == self.units_of_gpu[g] == per_gpu]
        if not must_gpus <= set(fully_free) or len(fully_free) < count:
            return None
        chosen = self._best_connected(fully_free, sorted(must_gpus, key=self._order.__getitem__), count)
        return [d for g in chosen for d in self._ids_of_gpu[g]]

    def _best_connected(self, candidates: list[str], required: list[str], count: int) -> list[str]:
        """`count` GPUs including `required`, maximising NVLinks among them; lowest indexes on ties."""
        rest = sorted((g for g in candidates if g not in required), key=self._order.__getitem__)
        need = count - len(required)
        if need <= 0:
            return required[:count]

        def links(group: Sequence[str]) -> int:
            return sum(self.node.nvlinks(a, b) for a, b in itertools.combinations(group, 2))

        if len(rest) <= _EXHAUSTIVE_LIMIT:
            best = max(itertools.combinations(rest, need), key=lambda extra: links([*required, *extra]))
            return [*required, *best]
        chosen = list(required)
        pool = list(rest)
        while len(chosen) < count:
            pick = max(pool, key=lambda g: sum(self.node.nvlinks(g, c) for c in chosen))
            chosen.append(pick)
            pool.remove(pick)
        return chosen

    def _best_fit(self, counts: Mapping[str, int], must_gpus: set[str], size: int) -> str | None:
        if len(must_gpus) > 1:
            return None
        candidates = [g for g in self._gpu_order if counts.get(g, 0) >= size and (not must_gpus or g in must_gpus)]
        if not candidates:
            return None
        return min(candidates, key=lambda g: (counts[g], self._order[g]))

    def _take(self, gpu: str, free_set: Collection[str], must: Sequence[str], size: int) -> list[str]:
        chosen = [d for d in must if self.gpu_of[d] == gpu]
        taken = set(chosen)
        if len(chosen) < size:
            rest = (d for d in self._free_ids(gpu, free_set) if d not in taken)
            chosen.extend(itertools.islice(rest, size - len(chosen)))
        return chosen

    def _spill(self, counts: Mapping[str, int], free_set: Collection[str], must: Sequence[str], size: int) -> list[str]:
        chosen = list(must)
        taken = set(chosen)
        for gpu in sorted(counts, key=lambda g: (-counts[g], self._order[g])):
            for device_id in self._free_ids(gpu, free_set):
                if len(chosen) >= size:
                    return chosen
                if device_id not in taken:
                    chosen.append(device_id)
                    taken.add(device_id)
        return chosen[:size] if len(chosen) > size else chosen

    # --- Allocate -----------------------------------------------------------------------

    def grant(self, device_ids: Sequence[str], unhealthy: Collection[str] = ()) -> MemoryGrant:
        """What the container gets for `device_ids`, or AllocationError saying why it may not."""
        if not device_ids:
            raise AllocationError("no gpu-memory devices in the request")
        unknown = [d for d in device_ids if d not in self.gpu_of]
        if unknown:
            raise AllocationError(f"unknown device ID(s) {_few(unknown)}: not advertised by this plugin")
        if len(set(device_ids)) != len(device_ids):
            raise AllocationError("device ID(s) requested twice in one container request")
        sick = [d for d in device_ids if d in unhealthy]
        if sick:
            raise AllocationError(f"unhealthy device ID(s) {_few(sick)}: their GPU is reporting errors")
        by_gpu = self.group(device_ids)
        gpus = sorted(by_gpu, key=self._order.__getitem__)
        if len(gpus) == 1:
            gpu = gpus[0]
            units = len(by_gpu[gpu])
            return MemoryGrant(
                gpu_uuids=(gpu,),
                units=units,
                memory_mib=units * self.unit_mib,
                fraction=units / self.units_of_gpu[gpu],
            )
        partial = [g for g in gpus if len(by_gpu[g]) != self.units_of_gpu[g]]
        if partial:
            spread = ", ".join(f"{g} ({len(by_gpu[g])}/{self.units_of_gpu[g]} units)" for g in gpus)
            raise AllocationError(
                f"{len(device_ids)} gpu-memory units span {len(gpus)} GPUs: {spread}; a request smaller than a GPU "
                "must fit on one GPU and a larger one must be whole GPUs. No single GPU on this node had enough "
                "free memory: the scheduler placed the pod on the node's total (see gpuslice steering labels)"
            )
        sizes = {self.units_of_gpu[g] for g in gpus}
        if len(sizes) != 1:
            raise AllocationError(f"whole-GPU request mixes GPUs of different memory sizes: {', '.join(gpus)}")
        per_gpu = sizes.pop()
        return MemoryGrant(gpu_uuids=tuple(gpus), units=per_gpu, memory_mib=per_gpu * self.unit_mib, fraction=1.0)


class MigSlices:
    """The `<prefix>/mig-<profile>` devices of one node: one device per MIG device."""

    def __init__(self, node: inventory.NodeInventory, profile: str) -> None:
        self.profile = profile
        self.devices: dict[str, inventory.MigDevice] = {m.uuid: m for m in node.mig_devices() if m.profile == profile}
        self._parent_index = {g.uuid: g.index for g in node.gpus}
        self.device_ids: tuple[str, ...] = tuple(self.devices)

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """Must-include first, then slices from the GPU with the fewest free slices (packs MIG GPUs)."""
        chosen = [d for d in dict.fromkeys(must_include) if d in self.devices][:size]
        pool = [d for d in available if d in self.devices and d not in chosen]
        free_on: dict[str, int] = {}
        for d in pool:
            parent = self.devices[d].parent_uuid
            free_on[parent] = free_on.get(parent, 0) + 1
        pool.sort(key=lambda d: (free_on[self.devices[d].parent_uuid], self._parent_index[self.devices[d].parent_uuid]))
        return [*chosen, *pool[: max(0, size - len(chosen))]]

    def grant(self, device_ids: Sequence[str], unhealthy: Collection[str] = ()) -> MigGrant:
        if not device_ids:
            raise AllocationError(f"no mig-{self.profile} devices in the request")
        unknown = [d for d in device_ids if d not in self.devices]
        if unknown:
            raise AllocationError(f"unknown MIG device(s) {_few(unknown)} for profile {self.profile}")
        if len(set(device_ids)) != len(device_ids):
            # kubelet counted each ID as a device: granting it once would give less than was admitted
            raise AllocationError("MIG device ID(s) requested twice in one container request")
        sick = [d for d in device_ids if d in unhealthy]
        if sick:
            raise AllocationError(f"unhealthy MIG device(s) {_few(sick)}")
        devices = [self.devices[d] for d in device_ids]
        return MigGrant(
            mig_uuids=tuple(m.uuid for m in devices),
            profile=self.profile,
            memory_mib=devices[0].memory_mib,
            parent_uuids=tuple(dict.fromkeys(m.parent_uuid for m in devices)),
        )


def _few(ids: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")
