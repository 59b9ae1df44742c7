"""Choosing the GPU class (a GPU memory size, webhook/cluster.py) a converted pod is pinned to:
the classes the pod may use (the products it selects), the one with the largest free share on
nodes where the pod fits now (in DRA mode, for a share that asks CPU while the scheduler is behind
the admissions, first among the classes with that CPU per free GPU), and the node-affinity pin
and decision notes that record the choice.
A gpu-memory share is not pinned to one class, only kept off classes whose GPUs are too small.
Pure: reads the cluster through the answer seam (webhook/answerinputs.py), changes nothing.

Raises parsing.Invalid (the pod is refused) when no class can ever run the pod.
May import gpuslice.{config,contract,labelcodec} and the webhook's answerinputs, conversions and parsing
modules (never the cluster view itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gpuslice import config, labelcodec
from gpuslice import contract as contract_
from gpuslice.webhook import answerinputs, conversions, parsing

__all__ = ["BEHIND_PODS", "Choice", "Demand", "candidates", "for_fraction", "for_memory", "for_whole_gpus"]

_NO_NODES = "defaultGpuMemoryMiB (no GPU nodes seen)"
_RICH = "largest free share where the free GPUs have the CPU it asks per GPU"
# Converted pods waiting for a placement beyond which the scheduler is behind the admissions (a
# burst): one pod at a time, each is placed before the next is admitted, so at most a few wait.
BEHIND_PODS = 8


@dataclasses.dataclass(frozen=True)
class Demand:
    """What the pod needs on one node, to judge which GPU class can run it now."""

    fraction: float = 0.0  # share of one GPU; 0 for whole GPUs
    whole_gpus: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    devices: int = 1  # GPUs the fraction is taken of (gpu-fraction-num-devices)

    def units(self, units_per_gpu: int) -> int:
        """Units on one GPU of a class of `units_per_gpu` (or whole GPUs) the pod needs there."""
        if self.whole_gpus:
            return self.whole_gpus
        return conversions.fraction_units(self.fraction, units_per_gpu)

    def cpu_per_gpu_milli(self) -> float:
        """The CPU a share asks per GPU of memory it takes; 0 for whole GPUs or no CPU asked."""
        if self.whole_gpus or not self.fraction or self.cpu_milli <= 0:
            return 0.0
        return self.cpu_milli / (self.fraction * self.devices)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The class chosen for a fraction or whole GPUs (the default GPU size when no class is known)."""

    memory_mib: int  # GPU memory of the class: what a fraction is taken of
    required: list[dict[str, Any]]  # the pin: required node-affinity expressions
    notes: dict[str, Any]  # for the decision annotation
    largest_node_gpus: int  # GPUs of the class's largest node; 0 when no class is known
    # for_fraction: the memory (MiB) of every class the pod may use, the chosen one included
    # (what a DRA-mode fraction may list: webhook/shares.py).
    candidates: tuple[int, ...] = ()


def candidates(inputs: answerinputs.Inputs, products: frozenset[str] | None) -> list[answerinputs.GpuClass]:
    """The classes the pod may use: all, or those carrying a product it selects."""
    classes = inputs.classes()
    if products is None:
        return classes
    chosen = [c for c in classes if c.products & products]
    if classes and not chosen:
        known = ", ".join(sorted({p for c in classes for p in c.products})) or "none"
        raise parsing.Invalid(
            f"the pod selects GPU product {parsing.cut(', '.join(sorted(products)))}, but no gpuslice GPU node has it "
            f"(products known: {known})"
        )
    return chosen


def _no_nodes(settings: config.Config) -> Choice:
    """No GPU node known (no cluster, or none labelled yet): the configured default memory, unpinned."""
    memory = settings.default_gpu_memory_mib
    return Choice(memory, [], {"classMemoryMiB": memory, "rule": _NO_NODES}, 0)


def for_fraction(
    inputs: answerinputs.Inputs,
    products: frozenset[str] | None,
    settings: config.Config,
    demand: Demand,
    gpus: int = 1,
) -> Choice:
    """The class a gpu-fraction is taken of; for a fraction of each of `gpus` GPUs in one pod
    (gpu-fraction-num-devices), among the classes with a node that has that many, if any (else
    the pod waits in the class chosen, as no node can run it)."""
    every = candidates(inputs, products)
    if not every:
        return _no_nodes(settings)
    classes = every
    if gpus > 1:
        classes = [c for c in every if c.max_gpus_per_node >= gpus] or every
        demand = dataclasses.replace(demand, devices=gpus)
    choice = _pinned(classes, inputs, settings.contract, demand, cpu_first=settings.dra.enabled)
    return dataclasses.replace(choice, candidates=tuple(c.memory_mib for c in every))


def for_whole_gpus(
    inputs: answerinputs.Inputs,
    products: frozenset[str] | None,
    settings: config.Config,
    demand: Demand,
) -> Choice:
    """The class whose nodes have enough GPUs for `demand.whole_gpus` in one pod."""
    classes = candidates(inputs, products)
    if not classes:
        return _no_nodes(settings)
    fitting = [c for c in classes if c.max_gpus_per_node >= demand.whole_gpus]
    if not fitting:
        raise parsing.Invalid(
            f"{contract_.NVIDIA_GPU}: {demand.whole_gpus} GPUs in one pod, but no gpuslice node has that many "
            f"(most on one node: {max(c.max_gpus_per_node for c in classes)})"
        )
    return _pinned(fitting, inputs, settings.contract, demand)


def for_memory(
    mib: int,
    units: int,
    inputs: answerinputs.Inputs,
    products: frozenset[str] | None,
    settings: config.Config,
) -> tuple[list[dict[str, Any]], dict[str, Any], int, int]:
    """(required expressions, decision notes, units of one GPU or 0 when several classes fit,
    GPUs of the largest fitting node or 0) for a gpu-memory share of `units` (`mib` asked)."""
    contract = settings.contract
    classes = candidates(inputs, products)
    if not classes:
        largest = settings.default_gpu_memory_mib
        if units > contract.units_per_gpu(largest):
            raise parsing.Invalid(
                f"annotation {contract_.KAI_GPU_MEMORY}={mib} MiB is larger than any known GPU "
                f"(no GPU nodes seen; assumed {largest} MiB, defaultGpuMemoryMiB)"
            )
        return [], {"classMemoryMiB": None, "rule": "memory"}, 0, 0
    fitting = [c for c in classes if contract.units_per_gpu(c.memory_mib) >= units]
    if not fitting:
        sizes = ", ".join(f"{c.memory_mib} MiB" for c in classes)
        raise parsing.Invalid(
            f"annotation {contract_.KAI_GPU_MEMORY}: {mib} MiB ({units} units of {contract.unit_mib} MiB) "
            f"is larger than any known GPU (GPU memory: {sizes}); accepted: at most "
            f"{max(contract.units_per_gpu(c.memory_mib) for c in classes) * contract.unit_mib} MiB"
        )
    required = []
    if len(fitting) < len(inputs.classes()):
        # Some GPUs are too small: keep the pod off their nodes even without steering labels.
        values = [labelcodec.count_value(c.memory_mib) for c in fitting]
        required.append({"key": contract.label_gpu_memory_mib, "operator": "In", "values": values})
    notes = {
        "classMemoryMiB": [c.memory_mib for c in fitting] if len(fitting) > 1 else fitting[0].memory_mib,
        "products": sorted({p for c in fitting for p in c.products}),
        "rule": "memory",
    }
    per_gpu = contract.units_per_gpu(fitting[0].memory_mib) if len(fitting) == 1 else 0
    largest = max(c.max_gpus_per_node for c in fitting)
    return required, notes, per_gpu, largest


def _pinned(
    classes: Sequence[answerinputs.GpuClass],
    inputs: answerinputs.Inputs,
    contract: contract_.Contract,
    demand: Demand,
    *,
    cpu_first: bool = False,
) -> Choice:
    fresh = _Best(classes, contract, inputs, demand, cpu_first=cpu_first)
    # A pod with a controller (and the pods whose answers it shares: they have one too) follows it.
    memory, rule = inputs.decided(_OwnersClass(classes, inputs, fresh) if inputs.owner else fresh)
    best = next(c for c in classes if c.memory_mib == memory)
    pin = {"key": contract.label_gpu_memory_mib, "operator": "In", "values": [labelcodec.count_value(best.memory_mib)]}
    notes = {"classMemoryMiB": best.memory_mib, "products": sorted(best.products), "rule": rule}
    return Choice(best.memory_mib, [pin], notes, best.max_gpus_per_node)


@dataclasses.dataclass(frozen=True)
class _Facts:
    """What the choice needs of one class that depends on the nodes alone."""

    units_per_gpu: int
    capacity: int  # units of all its GPUs
    free_share_key: tuple[float, int, int]  # largest free share first, then more GPUs, then the smaller GPU


def _facts(inputs: answerinputs.Inputs, contract: contract_.Contract) -> dict[int, _Facts]:
    """Per class memory, computed once per version of the view."""

    def build() -> dict[int, _Facts]:
        facts = {}
        for c in inputs.classes():
            per_gpu = contract.units_per_gpu(c.memory_mib)
            capacity = c.gpus * per_gpu
            free_share = c.free_units / capacity if capacity else 0.0
            facts[c.memory_mib] = _Facts(per_gpu, capacity, (-free_share, -c.gpus, c.memory_mib))
        return facts

    return inputs.derived(("classchoice", contract), build)


# Per class memory: (memory MiB, capacity in units, free-share key negated); with the units needed per class.
_Rows = tuple[dict[int, int], list[tuple[int, int, tuple[float, int, int]]]]
_MAX_DEMANDS = 1024


def _negated(key: tuple[float, int, int]) -> tuple[float, int, int]:
    """A `free_share_key` (smallest first) as a key to take the largest of."""
    return (-key[0], -key[1], -key[2])


class _OwnersClass:
    """The class the other pods of the pod's owner went to (`answerinputs.Inputs.owner`, the
    controller of the pod admitted now), while one of the pod's classes; else `_Best`'s, which the
    admission then records for the owner. A fraction or whole GPUs of another GPU model is another
    workload: the replicas of a Deployment, the pods of a Job or StatefulSet must not get 40 GiB on
    one node and 20 GiB on the next. Recorded like `_Best`, and read from the view each time it is
    asked: a remembered answer serves the pods of every owner of one template, each its own class."""

    __slots__ = ("_memories", "_inputs", "_best")
    reads_owner = True  # webhook/repeats.py sets the owner of the pod at hand before asking again

    def __init__(self, classes: Sequence[answerinputs.GpuClass], inputs: answerinputs.Inputs, best: _Best) -> None:
        self._inputs, self._best = inputs, best
        self._memories = frozenset(c.memory_mib for c in classes)

    def __call__(self) -> tuple[int, str]:
        chosen = self._best()
        owner = self._inputs.owner
        memory = self._inputs.owner_class(owner) if owner else None
        if memory is None or memory == chosen[0] or memory not in self._memories:
            return chosen
        return memory, "the class of the other pods of its owner"


class _Best:
    """(memory MiB, rule) of the class with the largest free share on nodes where the pod fits now
    (its units on one GPU, its CPU and memory beside them), with `cpu_first` (DRA mode) for a share
    that asks CPU first among the classes whose free GPUs have that CPU per GPU (promised GPUs
    counted as taken) while more than BEHIND_PODS converted pods wait for a placement; when no
    node has room, the largest free share overall (the pod then waits for room in that class).
    Called once per full review and again for every repeat of its remembered answer
    (webhook/repeats.py): what does not change until a node does is looked up once per version of
    the view, so a repeat reads only the promises and the count of pods waiting."""

    __slots__ = ("_classes", "_contract", "_inputs", "_demand", "_cpu_per_gpu", "_generation", "_free", "_per_class")

    def __init__(
        self,
        classes: Sequence[answerinputs.GpuClass],
        contract: contract_.Contract,
        inputs: answerinputs.Inputs,
        demand: Demand,
        *,
        cpu_first: bool = False,
    ) -> None:
        self._classes, self._contract, self._inputs, self._demand = classes, contract, inputs, demand
        self._cpu_per_gpu = demand.cpu_per_gpu_milli() if cpu_first else 0.0
        self._generation = -1
        self._free: answerinputs.Free | None = None
        self._per_class: list[tuple[int, int, tuple[float, int, int]]] = []

    def __call__(self) -> tuple[int, str]:
        classes = self._classes
        if len(classes) == 1:
            return classes[0].memory_mib, "only class"
        inputs = self._inputs
        if inputs.generation != self._generation:  # -1 at first: no view has that generation
            self._look_up()
            self._generation = inputs.generation
        assert self._free is not None
        units = self._free.now()
        top = self._largest(units, None)
        assert top is not None
        share, _, best = top
        if share > 0:
            if self._cpu_per_gpu and self._behind():
                # A class mixes nodes of several CPU sizes, so this is the class's average (a
                # fallback class in DRA mode asks it per node: webhook/patches.py). DRA mode only,
                # and only while the scheduler is behind: it places a burst several times slower
                # than it is created, so the class is chosen from promises, and on the full trace
                # CPU-hungry shares stranded 16 GiB GPUs. Placed one at a time, the pods find the
                # nodes' CPU in what "fits now" reads, and the rule cost packing (docs/benchmarks.md,
                # "DRA mode and device-plugin mode").
                allowed = answerinputs.with_cpu(units, self._inputs.cpu_per_free_gpu(), self._cpu_per_gpu)
                rich = self._largest(units, allowed)
                if rich is not None and rich[0] > 0 and rich[2] != best:
                    return rich[2], _RICH
            return best, "largest free share on nodes where the pod fits now"
        return best, "largest free share (no node has room now)"

    def _behind(self) -> bool:
        """Whether more than BEHIND_PODS converted pods wait for a placement (or no watch counts them)."""
        unplaced = self._inputs.unplaced()
        return unplaced is None or unplaced > BEHIND_PODS

    def _largest(
        self, units: dict[int, int], allowed: tuple[int, ...] | None
    ) -> tuple[float, tuple[float, int, int], int] | None:
        """(free share where the pod fits now, tie-break key, memory MiB) of the class with the
        largest, among `allowed` (None: every class). A loop, not max(): this runs for every repeat."""
        top: tuple[float, tuple[float, int, int], int] | None = None
        for memory, capacity, key in self._per_class:
            if allowed is not None and memory not in allowed:
                continue
            candidate = (units[memory] / capacity if capacity else 0.0, key, memory)
            if top is None or candidate > top:
                top = candidate
        return top

    def _look_up(self) -> None:
        """The units the pod needs in each class, and per class its capacity and tie-break key: per
        version of the view and GPU need, at most _MAX_DEMANDS of them, then afresh. Keyed by the
        fields, not the frozen dataclasses (hashing one costs a Python call per admission), and
        without the CPU and memory requests, which pods of one GPU need vary."""
        inputs, contract, demand = self._inputs, self._contract, self._demand
        memories = tuple(c.memory_mib for c in self._classes)
        known: dict[Any, _Rows] = inputs.derived(("best", contract.prefix, contract.unit_mib), dict)
        need = (memories, demand.fraction, demand.whole_gpus)
        rows = known.get(need)
        if rows is None:
            if len(known) >= _MAX_DEMANDS:
                known.clear()
            facts = _facts(inputs, contract)
            rows = known[need] = (
                {m: demand.units(facts[m].units_per_gpu) for m in memories},
                [(m, facts[m].capacity, _negated(facts[m].free_share_key)) for m in memories],
            )
        needs, self._per_class = rows
        self._free = inputs.free_units(
            needs, whole_gpus=bool(demand.whole_gpus), cpu_milli=demand.cpu_milli, memory_request_mib=demand.memory_mib
        )
