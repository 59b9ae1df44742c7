"""What an admission's answer reads of the cluster, through one seam: the answer cache
(webhook/repeats.py) gives a remembered answer again only while everything read through here
still comes out the same, and nothing below `mutation.mutate` sees the cluster view any other
way (the conversion steps and the steering are handed an `Inputs`, never the `ClusterView`;
import-linter contract "answer-seam" in pyproject.toml).

Two kinds of read, and no other:
- **Shape reads** (`classes`, `mig_profiles`, `pacer_absent`): what changes only when a node's GPUs,
  products or MIG profiles change or a pacer comes or goes. They hold while `shape_generation`
  holds, and `shape_generation` is computed from these same reads: a read added here is part of
  the shape, or it is a decision.
- **Decisions** (`decided`, and `cpu_pods_band` and `classes_with_cpu` through it): what free capacity, promises, an
  owner's class or the CPU admitted can change, on some node every few seconds. Each is taken
  through `decided` with a way to take it again; between `start_recording` and `stop_recording`
  it is recorded, and a remembered answer is given again only where every recorded decision,
  taken again, comes out the same. Only inside a decision may an answer read what moves with
  free capacity (`free_units`, `cpu_per_free_gpu`, `unplaced`, `derived`, `generation`, `owner_class`,
  `owner`).

A new steering input read straight from the view would be replayed stale; read here, it is one
of the two kinds, and checked as such.

May import gpuslice.webhook.cpudemand (the CPU demand's type) only: the view it reads is a
protocol, so webhook/cluster.py can own one without a cycle.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Protocol, TypeVar, cast

from gpuslice.webhook import cpudemand

__all__ = ["Free", "GpuClass", "Inputs", "View", "with_cpu"]

T = TypeVar("T")

# Shape generations, unique across every view's seam: an answer remembered against one view is
# never taken for another's (tests give one cache several views).
_GENERATIONS = itertools.count()


@dataclasses.dataclass(frozen=True)
class GpuClass:
    """All shared (non-MIG) GPUs of one memory size in the cluster."""

    memory_mib: int
    products: frozenset[str]
    gpus: int
    free_units: int
    nodes: int
    max_gpus_per_node: int


class Free(Protocol):
    """Free units per class for one demand, to ask again and again (`ClusterView.free_units`)."""

    def now(self) -> dict[int, int]: ...


class View(Protocol):
    """What the seam reads of the cluster view (webhook/cluster.py's `ClusterView`)."""

    generation: int
    pacer_absent: str
    cpu_demand: cpudemand.CpuDemand

    def classes(self) -> list[GpuClass]: ...
    def mig_profiles(self) -> dict[str, int]: ...
    def owner_class(self, owner: str) -> int | None: ...
    def cpu_per_free_gpu(self) -> dict[int, float | None]: ...
    def unplaced(self) -> int | None: ...
    def derived(self, key: Hashable, build: Callable[[], T]) -> T: ...
    def free_units(
        self, needs: Mapping[int, int], *, whole_gpus: bool = ..., cpu_milli: int = ..., memory_request_mib: int = ...
    ) -> Free: ...


class Inputs:
    """The seam of one cluster view (`ClusterView.inputs`)."""

    __slots__ = ("_view", "_reads", "owner", "_shape", "_shape_generation", "stale")

    def __init__(self, view: View) -> None:
        self._view = view
        self._reads: list[tuple[Callable[[], Hashable], Hashable]] | None = None
        # The controller of the pod being admitted ("" for none, or opted out): its pods go to one
        # GPU class (webhook/classchoice.py). Set by mutation.mutate, and by webhook/repeats.py
        # before a remembered answer's decisions are taken again.
        self.owner = ""
        self._shape: tuple[Any, ...] | None = None  # the shape reads, as last compared
        self._shape_generation = next(_GENERATIONS)
        self.stale = False  # set by the view when a shape read may have changed

    # --- shape reads: they hold while `shape_generation` does --------------------------------
    def classes(self) -> list[GpuClass]:
        """One class per distinct GPU memory size, smallest first."""
        return self._view.classes()

    def mig_profiles(self) -> dict[str, int]:
        """Resource-form MIG profile -> MiB of one device."""
        return self._view.mig_profiles()

    @property
    def pacer_absent(self) -> str:
        """ "" while a pacer renews its Lease, else why none is alive."""
        return self._view.pacer_absent

    @property
    def shape_generation(self) -> int:
        """Changes when a shape read changes: the classes' GPU memory, products, GPU and node counts
        and GPUs per node, the MIG profiles, the pacer. Free capacity (every allocation moves a
        label) does not move it: a remembered answer then holds if its decisions, taken again,
        come out the same (webhook/repeats.py)."""
        if self.stale:
            self.stale = False
            shape = (
                tuple([(c.memory_mib, c.products, c.gpus, c.nodes, c.max_gpus_per_node) for c in self.classes()]),
                tuple(sorted(self.mig_profiles().items())),
                self.pacer_absent,
            )
            if shape != self._shape:
                self._shape = shape
                self._shape_generation = next(_GENERATIONS)
        return self._shape_generation

    # --- decisions: recorded, and taken again for every remembered answer ----------------------
    def decided(self, again: Callable[[], T]) -> T:
        """`again()`, recorded between `start_recording` and `stop_recording` with `again` to take
        it again. Whatever free capacity, promises, an owner's class or the CPU demand can change
        is reached through this."""
        answer = again()
        if self._reads is not None:
            self._reads.append((again, cast(Hashable, answer)))
        return answer

    def cpu_pods_band(self, percent: int) -> bool:
        """Whether CPU-only pods ask more than `percent` % of the CPU admitted (webhook/cpudemand.py):
        a decision, as the share moves with every pod admitted."""
        demand = self._view.cpu_demand
        return self.decided(lambda: demand.above(percent))

    def start_recording(self) -> list[tuple[Callable[[], Hashable], Hashable]]:
        """Until `stop_recording`, every decision is appended to the list returned, with a way to
        take it again. (Not a context manager: this is on the admission path, and a
        generator-based one costs a few µs.)"""
        reads: list[tuple[Callable[[], Hashable], Hashable]] = []
        self._reads = reads
        return reads

    def stop_recording(self) -> None:
        self._reads = None

    # --- what decisions read (they move with free capacity: only inside `decided`) -------------
    @property
    def generation(self) -> int:
        """The view's version: changes with every node change (and when a pacer comes or goes)."""
        return self._view.generation

    def derived(self, key: Hashable, build: Callable[[], T]) -> T:
        """`build()`, once per version of the view (`ClusterView.derived`)."""
        return self._view.derived(key, build)

    def free_units(
        self, needs: Mapping[int, int], *, whole_gpus: bool = False, cpu_milli: int = 0, memory_request_mib: int = 0
    ) -> Free:
        """Free units per class where the demand fits, promises counted (`ClusterView.free_units`)."""
        return self._view.free_units(
            needs, whole_gpus=whole_gpus, cpu_milli=cpu_milli, memory_request_mib=memory_request_mib
        )

    def owner_class(self, owner: str) -> int | None:
        """The GPU class the converted pods of controller `owner` went to, if known."""
        return self._view.owner_class(owner)

    def cpu_per_free_gpu(self) -> dict[int, float | None]:
        """Per class: free CPU millicores per free GPU, promises counted; None where a node does not
        publish its CPU headroom (`ClusterView.cpu_per_free_gpu`)."""
        return self._view.cpu_per_free_gpu()

    def unplaced(self) -> int | None:
        """Converted pods waiting for the scheduler's placement (`ClusterView.unplaced`): many while
        it places a burst more slowly than the burst is admitted; None where no watch counts them."""
        return self._view.unplaced()

    def classes_with_cpu(self, memories: tuple[int, ...], cpu_per_gpu_milli: float) -> tuple[int, ...]:
        """Of the classes `memories`, those whose free GPUs have on average at least
        `cpu_per_gpu_milli` of free CPU each, promises counted (or that do not publish their CPU
        headroom): a decision."""

        def again() -> tuple[int, ...]:
            return with_cpu(memories, self.cpu_per_free_gpu(), cpu_per_gpu_milli)

        return self.decided(again)


def with_cpu(memories: Iterable[int], ratios: Mapping[int, float | None], cpu_per_gpu_milli: float) -> tuple[int, ...]:
    """Of the classes `memories`, those whose free CPU per free GPU (`ratios`, as
    `Inputs.cpu_per_free_gpu`) is at least `cpu_per_gpu_milli`, or unknown."""
    return tuple([m for m in memories if (r := ratios.get(m, 0.0)) is None or r >= cpu_per_gpu_milli])
