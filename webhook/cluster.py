"""The webhook's view of the cluster's GPUs, built from the node labels the device plugin publishes.

A GPU class is a distinct GPU memory size (`<prefix>/gpu.memory-mib`): products with identical
memory are interchangeable for accounting, so a fraction converts to the same units on any of
them. The view keeps running aggregates per class (nodes, GPUs, free units, products, GPUs per
node) and per MIG profile, so `update_node` costs O(labels of one node) and `classes()` costs
O(classes): the simulator calls them after every bind on a thousand-node cluster. What admissions
derive from the nodes alone (the table the class choice scans, its answers, per-class figures) is
kept per version of the view (`derived`) and rebuilt on the first query after a node changes:
nodes change at the pace of watch events, admissions far more often.

Pods converted but not yet in any node's labels are promised capacity: the view owns the promise
ledger (`ledger`, webhook/promises.py, which says how promises are made, shared between replicas
and given back), on which its callers make, see and give back promises, and tells it when a
class's labelled free units drop. The node table the free units are counted from, and its
queries, are webhook/nodetable.py, behind the view's queries. Each is a module of its own because
it has one job the view need not know the inside of (the ledger knows no nodes; the table is how
the view answers fast, not what it knows).

Node labels are untrusted input: `nodelabels` reads and checks them, and a node whose labels cannot
be believed is left out (`untrusted` names it and says why; the node watch logs it and the metrics
count it).

An admission reads the view only through its answer seam (`inputs`, webhook/answerinputs.py),
which the answer cache checks; the view tells the seam when its shape may have changed.

No I/O (promises read a monotonic clock). May import gpuslice.contract and
webhook.{answerinputs,cpudemand,nodelabels,nodetable,promises} (never gpuslice.deviceplugin).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar, cast

from gpuslice import contract as contract_
from gpuslice.webhook import answerinputs, cpudemand, nodelabels, nodetable, promises
from gpuslice.webhook.answerinputs import GpuClass
from gpuslice.webhook.nodetable import FreeUnits
from gpuslice.webhook.promises import APPEAR_SECONDS, PROMISE_SECONDS

__all__ = ["APPEAR_SECONDS", "PROMISE_SECONDS", "ClusterView", "FreeUnits", "GpuClass"]

T = TypeVar("T")

# Owners whose class is remembered: the least recently converted go first (their next pod then takes
# the class chosen for it, and its siblings follow that one).
_MAX_OWNERS = 65536


@dataclasses.dataclass
class _ClassTotals:
    nodes: int = 0
    gpus: int = 0
    free_units: int = 0
    products: Counter[str] = dataclasses.field(default_factory=Counter)
    gpus_per_node: Counter[int] = dataclasses.field(default_factory=Counter)


_MISSING = object()  # `derived`: not built yet (None may be a value)
_GENERATIONS = itertools.count()


class ClusterView:
    """GPU classes and MIG profiles of the cluster, kept current one node at a time."""

    def __init__(
        self,
        contract: contract_.Contract,
        *,
        default_gpu_memory_mib: int,
        clock: Callable[[], float] = time.monotonic,
        extended_resources: bool = True,
    ) -> None:
        self.contract = contract
        # Device-plugin mode: nodes' labels are checked against kubelet's counts of our extended
        # resources (a node without them has its plugin down). DRA mode: nodes offer ResourceSlices,
        # not extended resources, so there is nothing to check the labels against.
        self.extended_resources = extended_resources
        self.default_gpu_memory_mib = default_gpu_memory_mib
        self._nodes: dict[str, nodelabels.NodeGpus] = {}
        self._classes: dict[int, _ClassTotals] = {}
        self._mig: Counter[tuple[str, int]] = Counter()  # (profile, MiB) -> nodes carrying it
        # Nodes left out (bad labels) or not steered to (plugin down): name -> (reason code, sentence).
        self.untrusted: dict[str, tuple[str, str]] = {}
        # Rebuilt on the first query after a change: admissions query far more often than nodes change.
        self._classes_cache: list[GpuClass] | None = None
        self._mig_cache: dict[str, int] | None = None
        # What admissions derive from the nodes alone (the table `usable_free_units` reads, the
        # class choice's per-class figures): built on the first query after a node changed.
        self._derived: dict[Hashable, Any] = {}
        # Changes with every node change (and when a pacer comes or goes), unique across views:
        # what admissions derive from the nodes alone holds while it does.
        self.generation = next(_GENERATIONS)
        # One row per node with shared GPUs, for `usable_free_units`: a scan of a thousand rows in
        # numpy per admission instead of a Python loop.
        self._table = nodetable.NodeTable()
        # Pods converted, not yet in any node's labels, on `clock` (the simulator passes its own).
        # Made, seen, given back and read on it (admission, webhook/waiting.py, the metrics); the
        # view itself only tells it of drops in a class's labelled free units.
        self.ledger = promises.Ledger(clock)
        # Owner (controller UID) -> the GPU class its converted pods went to, most recent last.
        self._owner_classes: collections.OrderedDict[str, int] = collections.OrderedDict()
        # Pacing: "" while a pacer renews its Lease (webhook/pacerlease.py), else why none is alive,
        # in the words a pod's decision carries. No cluster, no pacer: nothing is gated.
        self.pacer_absent = "no pacer Lease read (the webhook watches no cluster)"
        # The CPU asked by the pods admitted, CPU-only pods apart (turns the CPU pods' band on).
        self.cpu_demand = cpudemand.CpuDemand()
        # How many converted pods wait for the scheduler to place them (webhook/waiting.py's pending
        # pods, neither bound nor marked unschedulable): None while no pending-pod watch says.
        self.count_unplaced: Callable[[], int] | None = None
        # What an admission's answer reads of this view, and the answer cache checks: the one seam
        # (webhook/answerinputs.py). Told here when a shape read may have changed.
        self.inputs = answerinputs.Inputs(self)

    # --- updates -------------------------------------------------------------------------
    def update_node(self, name: str, labels: Mapping[str, str], *, status: Mapping[str, Any] | None = None) -> None:
        """Add or change node `name` from its labels (checked against its `status`, the node
        object's status, when given); a node without GPU labels, or with labels that cannot be
        believed (`untrusted` says why), is dropped."""
        try:
            gpus = nodelabels.read(labels, self.contract, status=status if self.extended_resources else None)
        except nodelabels.Distrusted as exc:
            self.untrusted[name] = (exc.reason, str(exc))
            gpus = None
        else:
            if gpus is not None and gpus.plugin_down:
                detail = f"{self.contract.gpu_memory_resource} is not allocatable: its device plugin is down"
                self.untrusted[name] = (nodelabels.PLUGIN_DOWN, detail)
            else:
                self.untrusted.pop(name, None)
        old = self._nodes.get(name)
        if old == gpus:
            return
        if old is not None and gpus is not None and old.memory_mib == gpus.memory_mib and old.memory_mib is not None:
            self.ledger.seen(old.memory_mib, old.free_units - gpus.free_units)
        if old is not None:
            self._apply(old, -1)
            del self._nodes[name]
        if gpus is not None:
            self._apply(gpus, +1)
            self._nodes[name] = gpus
        self._set_row(name, gpus)

    def remove_node(self, name: str) -> None:
        self.untrusted.pop(name, None)
        old = self._nodes.pop(name, None)
        if old is not None:
            self._apply(old, -1)
        self._set_row(name, None)

    def clear(self) -> None:
        """Forget every node (before a fresh list)."""
        self._nodes.clear()
        self.untrusted.clear()
        self._classes.clear()
        self._mig.clear()
        self._classes_cache = None
        self._mig_cache = None
        self._changed()
        self._table.clear()
        self.ledger.clear()

    def owner_class(self, owner: str) -> int | None:
        """The GPU class (memory MiB) the converted pods of controller `owner` went to, if known."""
        return self._owner_classes.get(owner)

    def note_owner_class(self, owner: str, decision: Mapping[str, Any] | None) -> None:
        """A pod of `owner` was converted to (or is seen pending in) the class its decision names."""
        memory = decision.get("classMemoryMiB") if decision else None
        if not owner or not isinstance(memory, int) or decision.get("migProfile"):  # type: ignore[union-attr]
            return
        known = self._owner_classes
        if known.get(owner) != memory:
            known[owner] = memory
        known.move_to_end(owner)
        if len(known) > _MAX_OWNERS:
            known.popitem(last=False)

    # --- pacing ------------------------------------------------------------------------------
    @property
    def pacer_alive(self) -> bool:
        return not self.pacer_absent

    def set_pacer(self, absent: str) -> bool:
        """Record that a pacer is alive (`absent` "") or why none is. A change is a new
        `generation`, so no answer remembered while a pacer was alive (a gated pod) is given once
        it is gone (webhook/repeats.py). Whether anything changed."""
        if absent == self.pacer_absent:
            return False
        self.pacer_absent = absent
        self.generation = next(_GENERATIONS)  # what nodes alone give (`derived`) still holds
        self.inputs.stale = True
        return True

    def node_names(self) -> set[str]:
        """Nodes in the view, and nodes left out for their labels (so a relist can forget them)."""
        return set(self._nodes) | set(self.untrusted)

    # --- queries -------------------------------------------------------------------------
    @property
    def known(self) -> bool:
        """True once a node with gpuslice GPU labels has been seen."""
        return bool(self._nodes)

    def classes(self) -> list[GpuClass]:
        """One class per distinct GPU memory size, smallest first."""
        if self._classes_cache is None:
            self._classes_cache = self._build_classes()
        return list(self._classes_cache)

    def _build_classes(self) -> list[GpuClass]:
        return [
            GpuClass(
                memory_mib=memory,
                products=frozenset(p for p, n in totals.products.items() if n > 0),
                gpus=totals.gpus,
                free_units=totals.free_units,
                nodes=totals.nodes,
                max_gpus_per_node=max((g for g, n in totals.gpus_per_node.items() if n > 0), default=0),
            )
            for memory, totals in sorted(self._classes.items())
        ]

    def usable_free_units(
        self,
        needs: Mapping[int, int],
        *,
        whole_gpus: bool = False,
        cpu_milli: int = 0,
        memory_request_mib: int = 0,
    ) -> dict[int, int]:
        """Free units of each class (GPU memory MiB -> what the pod needs there: units on one GPU,
        or whole GPUs with `whole_gpus`) on the nodes where the pod could be placed now: it fits on
        one GPU (or enough GPUs are fully free), and, where a node publishes its CPU and memory
        headroom, the pod's requests fit too. Capacity stranded behind a node's exhausted CPU does
        not count: a class full of such GPUs must not attract more pods. One pass over the table
        for every class: the admission path calls this for every converted pod. Units promised to
        pods converted since the labels were written (`ledger`) are not free, nor is the CPU they
        asked for: for a share of one GPU, a class with promised CPU counts at most the units that
        the CPU left on those nodes, once the promised pods have theirs, gives pods like this one
        (where every such node publishes its CPU headroom). A decision drawn from this answer must
        be reached through `Inputs.decided` (webhook/answerinputs.py). To ask for one demand again
        and again: `free_units`."""
        return self.free_units(
            needs, whole_gpus=whole_gpus, cpu_milli=cpu_milli, memory_request_mib=memory_request_mib
        ).now()

    def free_units(
        self,
        needs: Mapping[int, int],
        *,
        whole_gpus: bool = False,
        cpu_milli: int = 0,
        memory_request_mib: int = 0,
    ) -> FreeUnits:
        """`usable_free_units` for one demand, kept to be asked again (`FreeUnits.now`)."""
        return FreeUnits(self, self.ledger, (tuple(needs.items()), whole_gpus, cpu_milli, memory_request_mib))

    def cpu_per_free_gpu(self) -> dict[int, float | None]:
        """Per class (memory MiB): its nodes' free CPU millicores per free GPU (free units counted
        in GPUs), promised CPU and units counted as taken; 0.0 where nothing is free, None where a
        node of the class publishes no CPU headroom."""
        units, cpu = self.ledger.outstanding()
        ratios: dict[int, float | None] = {}
        for memory, (free_cpu, free_units, published) in self.node_query().class_cpu().items():
            gpus = (free_units - units.get(memory, 0)) / self.contract.units_per_gpu(memory)
            if not published:
                ratios[memory] = None
            else:
                ratios[memory] = (free_cpu - cpu.get(memory, 0.0)) / gpus if gpus > 0 else 0.0
        return ratios

    def unplaced(self) -> int | None:
        """Converted pods waiting for the scheduler's placement, or None where no watch counts them."""
        count = self.count_unplaced
        return count() if count is not None else None

    def node_query(self) -> nodetable.Query:
        """The node table of this version, as `FreeUnits` reads it (`nodetable.Version`)."""
        return self.derived(nodetable.Query, self._table.query)

    def derived(self, key: Hashable, build: Callable[[], T]) -> T:
        """`build()`, computed once per version of the view (until a node changes) and kept under
        `key`: for what admissions need from the nodes alone. Promises are not part of a version."""
        value = self._derived.get(key, _MISSING)
        if value is _MISSING:
            value = self._derived[key] = build()
        return cast(T, value)

    def mig_profiles(self) -> dict[str, int]:
        """Resource-form MIG profile -> MiB of one device (the smallest seen for that profile)."""
        if self._mig_cache is None:
            self._mig_cache = self._build_mig_profiles()
        return dict(self._mig_cache)

    def _build_mig_profiles(self) -> dict[str, int]:
        profiles: dict[str, int] = {}
        for (profile, memory), count in self._mig.items():
            if count > 0 and (profile not in profiles or memory < profiles[profile]):
                profiles[profile] = memory
        return profiles

    # --- internals -----------------------------------------------------------------------
    def _changed(self) -> None:
        self._derived.clear()
        self.generation = next(_GENERATIONS)
        self.inputs.stale = True

    def _set_row(self, name: str, node: nodelabels.NodeGpus | None) -> None:
        self._changed()
        self._table.set_row(name, node)

    def _apply(self, node: nodelabels.NodeGpus, sign: int) -> None:
        self._classes_cache = None
        self._mig_cache = None
        self._changed()
        if node.memory_mib is not None:
            totals = self._classes.setdefault(node.memory_mib, _ClassTotals())
            totals.nodes += sign
            totals.gpus += sign * node.gpus
            totals.free_units += sign * node.free_units
            if node.product:
                totals.products[node.product] += sign
                if totals.products[node.product] <= 0:
                    del totals.products[node.product]
            totals.gpus_per_node[node.gpus] += sign
            if totals.gpus_per_node[node.gpus] <= 0:
                del totals.gpus_per_node[node.gpus]
            if totals.nodes <= 0:
                del self._classes[node.memory_mib]
        for entry in node.mig_memory:
            self._mig[entry] += sign
            if self._mig[entry] <= 0:
                del self._mig[entry]
