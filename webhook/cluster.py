"""The webhook's view of the cluster's GPUs, built from the node labels the device plugin publishes.

A GPU class is a distinct GPU memory size (`<prefix>/gpu.memory-mib`): products with identical
memory are interchangeable for accounting, so a fraction converts to the same units on any of
them. The view keeps running aggregates per class (nodes, GPUs, free units, products, GPUs per
node) and per MIG profile, so `update_node` costs O(labels of one node) and `classes()` costs
O(classes): the simulator calls them after every bind on a thousand-node cluster. What admissions
derive from the nodes alone (the table the class choice scans, its answers, per-class figures) is
kept per version of the view (`derived`) and rebuilt on the first query after a node changes:
nodes change at the pace of watch events, admissions far more often.

Pods converted but not yet in any node's labels are promised capacity (`promise`): a burst is
converted faster than pods are bound and labels move, and without this every pod of the burst
would see the same free shares and be pinned to the same class, which then fills while the others
stay idle. A promise holds the pod's units and the CPU it asks beside them: a class whose nodes'
CPU the promised pods will take has no room for the next pod however many units it has free. A
promise lasts until the class's labelled free units drop by as much (the pod was allocated) or
`PROMISE_SECONDS` pass (the pod was deleted, or went elsewhere). A pod admitted but never stored
(refused later in admission: a ResourceQuota, another webhook, PodSecurity) gives its promise
back once the pending-pod watch has not seen it for `APPEAR_SECONDS` (`track_appearance`, set by
webhook/waiting.py: without the watch nothing could say it appeared).

Promises are shared between webhook replicas through the pods themselves: every replica's
pending-pod watch sees every converted pod, with its decision annotation (class and units). A pod
that appears without one of this replica's conversions of its class and size waiting for it
(`appeared` is False) was converted by another replica, and is promised here too (`promise_seen`)
until it is bound, unschedulable or deleted unbound, or its units show in the labels; so each
replica steers knowing what all of them admitted, and a drop in the labels consumes promises
whichever replica made them. Until its watch has listed, a replica steers by its own promises
alone (gpuslice_webhook_shared_promises says which).

Node labels are untrusted input: `nodelabels` reads and checks them, and a node whose labels cannot
be believed is left out (`untrusted` names it and says why; the node watch logs it and the metrics
count it).

An admission reads the view only through its answer seam (`inputs`, webhook/answerinputs.py),
which the answer cache checks; the view tells the seam when its shape may have changed.

No I/O (promises read a monotonic clock). May import numpy, gpuslice.contract and
webhook.{answerinputs,cpudemand,nodelabels} (never gpuslice.deviceplugin).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar, cast

import numpy as np

from gpuslice import contract as contract_
from gpuslice.webhook import answerinputs, cpudemand, nodelabels
from gpuslice.webhook.answerinputs import GpuClass

__all__ = ["APPEAR_SECONDS", "PROMISE_SECONDS", "ClusterView", "FreeUnits", "GpuClass"]

T = TypeVar("T")

# How long a conversion counts against its class when no label shows it: longer than a loaded
# scheduler takes to bind a burst's last pod, short enough that a pod that never ran is forgotten.
PROMISE_SECONDS = 300.0
# How long after its admission a converted pod must be in the API server (the webhook's watch sees
# it) before its promise is given back: later webhooks and admission plugins have a 30 s limit.
APPEAR_SECONDS = 30.0
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

_COLUMNS = ("memory_mib", "free_units", "free_block", "free_gpus", "free_cpu_milli", "free_memory_mib")
_MEMORY, _FREE_UNITS, _FREE_BLOCK, _FREE_GPUS, _FREE_CPU, _FREE_MEM = range(len(_COLUMNS))


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
        self.clock = clock  # promises' clock (the simulator passes its own)
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
        # numpy per admission instead of a Python loop. Rows of removed nodes are reused.
        self._rows: dict[str, int] = {}
        self._spare_rows: list[int] = []
        self._table = np.zeros((64, len(_COLUMNS)), dtype=np.int64)
        # Class memory MiB -> promises not yet seen in labels, oldest first:
        # [deadline, units, CPU millicores per unit].
        self._promised: dict[int, collections.deque[list[float]]] = {}
        self._promised_total: Counter[int] = Counter()  # their units per class, kept as they change
        self._promised_cpu: dict[int, float] = collections.defaultdict(float)  # their CPU per class
        self._next_deadline = math.inf  # no promise expires before this (`promises`)
        # Conversions admitted, not yet seen stored, per (class memory MiB, units): admission times
        # plus APPEAR_SECONDS, oldest first. Only while a watch says which pods appear.
        # Own conversions are remembered until the pending-pod watch sees them (`appeared`): set by
        # webhook/waiting.py when it is built, so that none admitted before its first list is lost.
        self.record_appearance = False
        self.track_appearance = False
        self._unseen: dict[tuple[int, int], collections.deque[float]] = {}
        self._next_unseen = math.inf
        self.not_created = 0  # promises given back because the pod never appeared
        self.promised_from_others = 0  # other replicas' conversions promised here (`promise_seen`)
        # Owner (controller UID) -> the GPU class its converted pods went to, most recent last.
        self._owner_classes: collections.OrderedDict[str, int] = collections.OrderedDict()
        # Pacing: "" while a pacer renews its Lease (webhook/pacerlease.py), else why none is alive,
        # in the words a pod's decision carries. No cluster, no pacer: nothing is gated.
        self.pacer_absent = "no pacer Lease read (the webhook watches no cluster)"
        # The CPU asked by the pods admitted, CPU-only pods apart (turns the CPU pods' band on).
        self.cpu_demand = cpudemand.CpuDemand()
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
            self._seen(old.memory_mib, old.free_units - gpus.free_units)
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
        self._rows.clear()
        self._spare_rows.clear()
        self._table[:] = 0
        self._promised.clear()
        self._promised_total.clear()
        self._promised_cpu.clear()
        self._next_deadline = math.inf
        self._unseen.clear()
        self._next_unseen = math.inf

    def promise(self, memory_mib: int, units: int, *, cpu_milli: int = 0, now: float | None = None) -> None:
        """A pod was just converted to `units` on a GPU of class `memory_mib`, asking `cpu_milli`
        beside them: count both as taken until the class's labels show the units (or
        PROMISE_SECONDS pass)."""
        if units > 0:
            deadline = (self.clock() if now is None else now) + PROMISE_SECONDS
            if deadline < self._next_deadline:
                self._next_deadline = deadline
            per_unit = (cpu_milli if cpu_milli > 0 else 0) / units
            queue = self._promised.get(memory_mib)
            if queue is None:  # not setdefault: it would build a deque for every promise
                queue = self._promised[memory_mib] = collections.deque()
            queue.append([deadline, units, per_unit])
            self._promised_total[memory_mib] += units
            self._promised_cpu[memory_mib] += units * per_unit

    def promise_conversion(self, decision: Mapping[str, Any] | None, cpu_milli: int = 0) -> None:
        """`promise` the units of a conversion pinned to one class (its decision annotation says
        which: `classMemoryMiB` and `units`; MIG and unpinned conversions promise nothing), with the
        pod's CPU request."""
        if not decision or decision.get("migProfile"):
            return
        memory, units = decision.get("classMemoryMiB"), decision.get("units")
        if isinstance(memory, int) and isinstance(units, int):
            self.promise(memory, units, cpu_milli=cpu_milli)
            if self.record_appearance and units > 0:
                deadline = self.clock() + APPEAR_SECONDS
                self._next_unseen = min(self._next_unseen, deadline)
                queue = self._unseen.get((memory, units))
                if queue is None:
                    queue = self._unseen[(memory, units)] = collections.deque()
                queue.append(deadline)

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

    def appeared(self, decision: Mapping[str, Any] | None) -> bool:
        """A converted pod was stored (the pending-pod watch saw it): one conversion of its class and
        size is no longer waiting to appear (which of them does not matter: they promise alike).
        False when none of this replica's was waiting: another replica converted it (or a process
        before this one), and `promise_seen` counts it here too."""
        if not decision or decision.get("migProfile"):
            return True  # nothing promised either way
        queue = self._unseen.get((decision.get("classMemoryMiB"), decision.get("units")))  # type: ignore[arg-type]
        if queue:
            queue.popleft()
            return True
        return False

    def promise_seen(self, decision: Mapping[str, Any] | None, cpu_milli: int = 0) -> None:
        """Another replica's conversion, seen pending and not yet bound: promised here as well, so
        every replica steers knowing what all of them admitted (the shared ledger). It lasts as this
        replica's own do: until the class's labels show it, it is released (unschedulable, deleted
        unbound) or PROMISE_SECONDS pass."""
        if not decision or decision.get("migProfile"):
            return
        memory, units = decision.get("classMemoryMiB"), decision.get("units")
        if isinstance(memory, int) and isinstance(units, int):
            self.promise(memory, units, cpu_milli=cpu_milli)
            self.promised_from_others += 1

    def _give_back_unseen(self, now: float) -> None:
        """Promises of conversions whose pods did not appear within APPEAR_SECONDS (only forgotten
        while the watch has not listed: nothing could have said they appeared)."""
        for (memory, units), queue in self._unseen.items():
            while queue and queue[0] <= now:
                queue.popleft()
                if self.track_appearance:
                    self.not_created += 1
                    self.release_conversion({"classMemoryMiB": memory, "units": units})
        self._next_unseen = min((q[0] for q in self._unseen.values() if q), default=math.inf)

    def release_conversion(self, decision: Mapping[str, Any] | None) -> None:
        """The pod of this conversion will not take its units soon (the scheduler found no node for
        it, or kubelet refused it): give back what `promise_conversion` counted, newest first, so a
        pod that waits does not hold its class's capacity for PROMISE_SECONDS."""
        if not decision or decision.get("migProfile"):
            return
        memory, units = decision.get("classMemoryMiB"), decision.get("units")
        if not (isinstance(memory, int) and isinstance(units, int)):
            return
        queue = self._promised.get(memory)
        while queue and units > 0:
            units -= self._take(memory, queue[-1], units)
            if queue[-1][1] <= 0:
                queue.pop()

    def promised_units(self, memory_mib: int, *, now: float | None = None) -> int:
        """Units of class `memory_mib` promised to converted pods and not yet seen in labels."""
        queue = self._promised.get(memory_mib)
        if not queue:
            return 0
        now = self.clock() if now is None else now
        while queue and queue[0][0] <= now:
            self._take(memory_mib, queue.popleft(), None)
        return self._promised_total[memory_mib]

    def _take(self, memory_mib: int, entry: list[float], units: int | None) -> int:
        """Take `units` (all when None) off one promise, with their CPU; the units taken."""
        taken = int(entry[1]) if units is None else min(units, int(entry[1]))
        entry[1] -= taken
        self._promised_total[memory_mib] -= taken
        self._promised_cpu[memory_mib] -= taken * entry[2]
        if not self._promised_total[memory_mib]:
            self._promised_cpu[memory_mib] = 0.0  # no float residue once nothing is promised
        return taken

    def _seen(self, memory_mib: int, decrease: int) -> None:
        """The class's labelled free units dropped by `decrease`: that many promised units are
        now in the labels (oldest promises first)."""
        queue = self._promised.get(memory_mib)
        while queue and decrease > 0:
            decrease -= self._take(memory_mib, queue[0], decrease)
            if queue[0][1] <= 0:
                queue.popleft()

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
        pods converted since the labels were written (`promise`) are not free, nor is the CPU they
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
        return FreeUnits(self, (tuple(needs.items()), whole_gpus, cpu_milli, memory_request_mib))

    def promises(self) -> tuple[Mapping[int, int], Mapping[int, float]]:
        """(units, CPU millicores) promised per class and not yet seen in labels, expired promises
        dropped: the view's own mappings, not to be changed. Cheap while none expires: every
        admission of a converted pod reads it, remembered or not."""
        if self._promised:
            now = self.clock()
            if now >= self._next_unseen:
                self._give_back_unseen(now)
            if now >= self._next_deadline:
                for memory in self._promised:
                    self.promised_units(memory, now=now)
                deadlines = [queue[0][0] for queue in self._promised.values() if queue]
                self._next_deadline = min(deadlines, default=math.inf)
        return self._promised_total, self._promised_cpu

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
    def _query(self) -> _Query:
        """The node table of this version, as `FreeUnits` reads it."""
        return self.derived(_Query, lambda: _Query(self._table))

    def _changed(self) -> None:
        self._derived.clear()
        self.generation = next(_GENERATIONS)
        self.inputs.stale = True

    def _set_row(self, name: str, node: nodelabels.NodeGpus | None) -> None:
        self._changed()
        row = self._rows.get(name)
        if node is None or node.memory_mib is None:
            if row is not None:
                self._table[row] = 0
                self._spare_rows.append(row)
                del self._rows[name]
            return
        if row is None:
            row = self._spare_rows.pop() if self._spare_rows else len(self._rows)
            if row >= len(self._table):
                grown = np.zeros((2 * len(self._table), len(_COLUMNS)), dtype=np.int64)
                grown[: len(self._table)] = self._table
                self._table = grown
            self._rows[name] = row
        self._table[row] = (
            node.memory_mib,
            node.free_units,
            node.free_block,
            node.free_gpus,
            node.free_cpu_milli,
            node.free_memory_mib,
        )

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


class FreeUnits:
    """`ClusterView.usable_free_units` for one demand, to ask again and again: the class choice of
    a remembered answer is taken again for every repeat (webhook/repeats.py). What the nodes alone
    give is looked up once per version of the view, so asking again reads only the promises."""

    __slots__ = ("_view", "_demand", "_generation", "_query", "_labelled", "_rows")

    def __init__(self, view: ClusterView, demand: tuple[tuple[tuple[int, int], ...], bool, int, int]) -> None:
        self._view = view
        self._demand = demand  # (needs, whole_gpus, cpu_milli, memory_mib), as _Query reads it
        self._generation = -1
        self._query: _Query | None = None
        self._labelled: dict[int, int] = {}
        # Per class: (memory, free CPU where the pod fits, units it needs there): built when first
        # needed in a version (where CPU is promised).
        self._rows: list[tuple[int, int | None, int]] | None = None

    def now(self) -> dict[int, int]:
        """Free units per class, as `usable_free_units` gives them now. Written for the retake of
        every remembered answer: conditionals, not min() and max() (a call each in Python 3.11)."""
        view = self._view
        if view.generation != self._generation:
            self._query = query = view._query()
            self._labelled = query.usable(*self._demand)
            self._rows = None
            self._generation = view.generation
        units, cpu = view.promises()
        _, whole_gpus, cpu_milli, _ = self._demand
        free = {}
        bounded = False
        for memory, labelled in self._labelled.items():
            left = labelled - units.get(memory, 0)
            free[memory] = left if left > 0 else 0
            bounded = bounded or cpu.get(memory, 0.0) > 0
        # Only where pods were promised CPU: with none in flight the labels count all there is, and
        # bounding a class by its nodes' summed CPU alone packed worse one pod at a time (the model,
        # docs/steering.md).
        if cpu_milli <= 0 or whole_gpus or not bounded:
            return free
        if self._rows is None:
            self._rows = self._cpu_rows()
        for memory, room, need in self._rows:
            promised = cpu.get(memory, 0.0)
            if room is not None and promised > 0:
                spare = room - promised
                pods = int((spare if spare > 0 else 0.0) / cpu_milli * need)
                if pods < free[memory]:
                    free[memory] = pods
        return free

    def _cpu_rows(self) -> list[tuple[int, int | None, int]]:
        """Per class: (memory, free CPU on the nodes where the pod fits or None, units needed, at least 1)."""
        assert self._query is not None
        rooms = self._query.cpu_room(*self._demand)
        return [(memory, rooms[memory], need if need > 1 else 1) for memory, need in self._demand[0]]


class _Query:
    """The node table of one version of the view (built on the first admission after a node
    changed, which is far rarer than admissions), as `usable_free_units` reads it: only the rows
    of nodes with shared GPUs, each with the index of its class, so one query is a few vector
    operations over all classes at once; and the answers already given for this version, by the
    pod's demand: the pods of one Deployment or Job ask alike, and a burst of them is admitted
    between two label changes."""

    _MAX_ANSWERS = 1024  # distinct demands remembered per version; more start the memo afresh
    _MAX_WEIGHTS = 64  # distinct GPU needs (a few per fraction or whole-GPU count); each a classes x nodes matrix

    def __init__(self, table: np.ndarray) -> None:
        rows = table[table[:, _MEMORY] > 0]
        self.memories, self.class_of = np.unique(rows[:, _MEMORY], return_inverse=True)
        self.index = {int(m): i for i, m in enumerate(self.memories)}
        self.units = rows[:, _FREE_UNITS]
        self.block, self.gpus = rows[:, _FREE_BLOCK], rows[:, _FREE_GPUS]
        # A node that does not publish its CPU or memory headroom (-1) is not ruled out by it:
        # read as if it had all, so a request is one comparison.
        unbounded = np.iinfo(np.int64).max
        self.cpu_published = rows[:, _FREE_CPU] >= 0
        self.all_published = bool(self.cpu_published.all())
        self.cpu_known = np.where(self.cpu_published, rows[:, _FREE_CPU], 0)
        self.cpu = np.where(self.cpu_published, rows[:, _FREE_CPU], unbounded)
        self.mem = np.where(rows[:, _FREE_MEM] < 0, unbounded, rows[:, _FREE_MEM])
        self.answers: dict[tuple[Any, ...], dict[int, int]] = {}
        self.rooms: dict[tuple[Any, ...], dict[int, int | None]] = {}
        self._fit_key: tuple[int, int] | None = None
        self._fit = np.ones(len(self.cpu), dtype=bool)
        self.weights: dict[tuple[Any, ...], np.ndarray] = {}
        self.masks: dict[tuple[Any, ...], np.ndarray] = {}

    def usable(
        self, needs: tuple[tuple[int, int], ...], whole_gpus: bool, cpu_milli: int, memory_mib: int
    ) -> dict[int, int]:
        """Labelled free units per class on nodes where the demand fits (no promises counted);
        the memo's own dict, not to be changed."""
        key = (needs, whole_gpus, cpu_milli, memory_mib)
        answer = self.answers.get(key)
        if answer is None:
            if len(self.answers) >= self._MAX_ANSWERS:
                self.answers.clear()
            answer = self.answers[key] = self._compute(needs, whole_gpus, cpu_milli, memory_mib)
        return answer

    def cpu_room(
        self, needs: tuple[tuple[int, int], ...], whole_gpus: bool, cpu_milli: int, memory_mib: int
    ) -> dict[int, int | None]:
        """Free CPU millicores per class on the nodes where the demand fits (as `usable`); None
        for a class where such a node does not publish its CPU headroom."""
        key = (needs, whole_gpus, cpu_milli, memory_mib)
        answer = self.rooms.get(key)
        if answer is None:
            if len(self.rooms) >= self._MAX_ANSWERS:
                self.rooms.clear()
            fits = self._fits(cpu_milli, memory_mib)
            mask = self._mask(needs, whole_gpus)
            sums = (mask @ (fits * self.cpu_known)).tolist()
            unknown = [False] * len(sums) if self.all_published else (mask @ (fits & ~self.cpu_published)).tolist()
            index = self.index
            answer = self.rooms[key] = {
                m: None if m not in index or unknown[index[m]] else sums[index[m]] for m, _ in needs
            }
        return answer

    def _mask(self, needs: tuple[tuple[int, int], ...], whole_gpus: bool) -> np.ndarray:
        """Classes x nodes: 1 where the pod's GPU need fits on the node (`_weights` > 0), kept alike."""
        key = (needs, whole_gpus)
        mask = self.masks.get(key)
        if mask is None:
            if len(self.masks) >= self._MAX_WEIGHTS:
                self.masks.clear()
            mask = self.masks[key] = (self._weights(needs, whole_gpus) > 0).astype(np.int64)
        return mask

    def _fits(self, cpu_milli: int, memory_mib: int) -> np.ndarray:
        """Nodes where the requests fit; the last answer kept (`usable` and `cpu_room` ask in turn)."""
        if self._fit_key != (cpu_milli, memory_mib):
            self._fit_key, self._fit = (cpu_milli, memory_mib), (self.cpu >= cpu_milli) & (self.mem >= memory_mib)
        return self._fit

    def _compute(
        self, needs: tuple[tuple[int, int], ...], whole_gpus: bool, cpu_milli: int, memory_mib: int
    ) -> dict[int, int]:
        weights = self._weights(needs, whole_gpus)
        if cpu_milli > 0 or memory_mib > 0:
            sums = weights @ self._fits(cpu_milli, memory_mib)
        else:
            sums = weights.sum(axis=1)
        return {m: int(sums[self.index[m]]) if m in self.index else 0 for m, _ in needs}

    def _weights(self, needs: tuple[tuple[int, int], ...], whole_gpus: bool) -> np.ndarray:
        """Classes x nodes: a node's free units in its class's row where the pod's GPU need fits
        there, else 0. Pods with the same GPU need and other CPU and memory requests share it:
        one product with the nodes where the requests fit then sums every class at once."""
        key = (needs, whole_gpus)
        weights = self.weights.get(key)
        if weights is None:
            if len(self.weights) >= self._MAX_WEIGHTS:
                self.weights.clear()
            # A class the pod does not ask about needs more than any node has: its rows never count.
            need = np.full(len(self.memories), np.iinfo(np.int64).max, dtype=np.int64)
            for memory, units in needs:
                if memory in self.index:
                    need[self.index[memory]] = max(1, units)
            fits = (self.gpus if whole_gpus else self.block) >= need[self.class_of]
            weights = np.zeros((len(self.memories), len(self.class_of)), dtype=np.int64)
            weights[self.class_of, np.arange(len(self.class_of))] = np.where(fits, self.units, 0)
            self.weights[key] = weights
        return weights
