"""The node's GPUs: one data model filled by two sources (NVML, or a node file for tests,
the demo and the simulator). Pure data: no I/O, no NVML.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

__all__ = ["MigDevice", "Gpu", "NodeInventory"]


@dataclasses.dataclass(frozen=True)
class MigDevice:
    uuid: str  # "MIG-..."
    profile: str  # canonical, as NVIDIA names it: "1g.10gb", "1c.2g.20gb", "1g.10gb+me"
    memory_mib: int
    parent_uuid: str


@dataclasses.dataclass(frozen=True)
class Gpu:
    uuid: str  # "GPU-..."
    model: str  # product name, e.g. "NVIDIA H100 80GB HBM3"
    memory_mib: int
    index: int
    numa_node: int | None = None  # None: no NUMA affinity known
    minor_number: int | None = None
    pci_bus_id: str = ""
    # peer GPU UUID -> number of NVLinks between the two
    nvlinks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    mig_enabled: bool = False
    mig: tuple[MigDevice, ...] = ()
    # Set when this "GPU" is a MIG device shared by memory units (migStrategy single): the physical
    # GPU, whose failures are this device's too.
    parent_uuid: str = ""

    def nvlinks_to(self, other: str) -> int:
        return self.nvlinks.get(other, 0)


@dataclasses.dataclass(frozen=True)
class NodeInventory:
    gpus: tuple[Gpu, ...]
    source: str = ""  # "nvml" or the node file's path, for messages

    def __post_init__(self) -> None:
        uuids = [g.uuid for g in self.gpus] + [m.uuid for m in self.mig_devices()]
        duplicates = sorted({u for u in uuids if uuids.count(u) > 1})
        if duplicates:
            raise ValueError(f"{self.source or 'inventory'}: duplicate UUID {duplicates[0]}")

    def gpu(self, uuid: str) -> Gpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise KeyError(uuid)

    @property
    def memory_gpus(self) -> tuple[Gpu, ...]:
        """GPUs shared by memory units: every GPU not in MIG mode."""
        return tuple(g for g in self.gpus if not g.mig_enabled)

    def mig_devices(self) -> Iterator[MigDevice]:
        for gpu in self.gpus:
            yield from gpu.mig

    def mig_profiles(self) -> tuple[str, ...]:
        return tuple(sorted({m.profile for m in self.mig_devices()}))

    def nvlinks(self, a: str, b: str) -> int:
        """NVLinks between two GPUs, taking the larger count if the two sides disagree."""
        return max(self.gpu(a).nvlinks_to(b), self.gpu(b).nvlinks_to(a))
