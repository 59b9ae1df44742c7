"""The node table: one numpy row per node with shared GPUs, and the queries admissions make of it.

`ClusterView.usable_free_units` asks, for every converted pod, how many units of each GPU class are
free on the nodes where the pod could be placed now. A Python loop over a thousand nodes per
admission is too slow, so the nodes' figures (class, free units, largest free block, fully free
GPUs, CPU and memory headroom) are kept in one table (`NodeTable`, a row per node, rows of removed
nodes reused) and asked through a `Query` built once per version of the view: one query is a few
vector operations over all classes at once, and its answers are remembered for the version.
`FreeUnits` asks one demand again and again, less the promises (webhook/promises.py) each time.

A module of its own because this is how the view answers fast, not what it knows: the view
(webhook/cluster.py) owns the table, says when a node's row changes, and keeps a `Query` per
version; the numbers here must equal a count node by node (tests/webhook/test_nodetable.py).

No I/O. May import numpy and gpuslice.webhook.nodelabels (a node's figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from gpuslice.webhook import nodelabels

__all__ = ["FreeUnits", "NodeTable", "Promised", "Query", "Version"]

_COLUMNS = ("memory_mib", "free_units", "free_block", "free_gpus", "free_cpu_milli", "free_memory_mib")
_MEMORY, _FREE_UNITS, _FREE_BLOCK, _FREE_GPUS, _FREE_CPU, _FREE_MEM = range(len(_COLUMNS))


class NodeTable:
    """One row per node with shared GPUs (a GPU memory class), for `Query`. Rows of removed
    nodes are reused."""

    def __init__(self) -> None:
        self._rows: dict[str, int] = {}
        self._spare_rows: list[int] = []
        self._table = np.zeros((64, len(_COLUMNS)), dtype=np.int64)

    def set_row(self, name: str, node: nodelabels.NodeGpus | None) -> None:
        """Node `name` now has the figures of `node` (None, or no memory class: no row)."""
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

    def clear(self) -> None:
        """No rows."""
        self._rows.clear()
        self._spare_rows.clear()
        self._table[:] = 0

    def query(self) -> Query:
        """The table as it is now, to query (the view keeps one per version)."""
        return Query(self._table)


class Version(Protocol):
    """What `FreeUnits` reads of the view (webhook/cluster.py's `ClusterView`): its version, and
    the node table's `Query` of that version."""

    generation: int

    def node_query(self) -> Query: ...


class Promised(Protocol):
    """What `FreeUnits` reads of the promises (webhook/promises.py's `Ledger`), read straight from
    the ledger: through a method of the view it would cost a call for every repeat."""

    def outstanding(self) -> tuple[Mapping[int, int], Mapping[int, float]]: ...


class FreeUnits:
    """`ClusterView.usable_free_units` for one demand, to ask again and again: the class choice of
    a remembered answer is taken again for every repeat (webhook/repeats.py). What the nodes alone
    give is looked up once per version of the view, so asking again reads only the promises."""

    __slots__ = ("_view", "_promised", "_demand", "_generation", "_query", "_labelled", "_rows")

    def __init__(
        self, view: Version, promised: Promised, demand: tuple[tuple[tuple[int, int], ...], bool, int, int]
    ) -> None:
        self._view = view
        self._promised = promised
        self._demand = demand  # (needs, whole_gpus, cpu_milli, memory_mib), as Query reads it
        self._generation = -1
        self._query: Query | None = None
        self._labelled: dict[int, int] = {}
        # Per class: (memory, free CPU where the pod fits, units it needs there): built when first
        # needed in a version (where CPU is promised).
        self._rows: list[tuple[int, int | None, int]] | None = None

    def now(self) -> dict[int, int]:
        """Free units per class, as `usable_free_units` gives them now. Written for the retake of
        every remembered answer: conditionals, not min() and max() (a call each in Python 3.11)."""
        view = self._view
        if view.generation != self._generation:
            self._query = query = view.node_query()
            self._labelled = query.usable(*self._demand)
            self._rows = None
            self._generation = view.generation
        units, cpu = self._promised.outstanding()
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


class Query:
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
        self._class_cpu: dict[int, tuple[int, int, bool]] | None = None
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

    def class_cpu(self) -> dict[int, tuple[int, int, bool]]:
        """Per class: (free CPU millicores, free units, whether every node of the class publishes
        its CPU headroom), summed over the class's nodes; once per version."""
        if self._class_cpu is None:
            n = len(self.memories)
            cpu = np.bincount(self.class_of, weights=self.cpu_known, minlength=n).tolist()
            units = np.bincount(self.class_of, weights=self.units, minlength=n).tolist()
            hidden = np.bincount(self.class_of, weights=~self.cpu_published, minlength=n).tolist()
            self._class_cpu = {int(m): (int(cpu[i]), int(units[i]), not hidden[i]) for i, m in enumerate(self.memories)}
        return self._class_cpu

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
