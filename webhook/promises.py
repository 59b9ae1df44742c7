"""The promise ledger: capacity counted as taken by pods converted but not yet in any node's labels.

A burst is converted faster than pods are bound and labels move, and without promises every pod of
the burst would see the same free shares and be pinned to the same class, which then fills while
the others stay idle. A promise holds the pod's units and the CPU it asks beside them: a class
whose nodes' CPU the promised pods will take has no room for the next pod however many units it
has free. A promise lasts until the class's labelled free units drop by as much (`seen`: the pod
was allocated) or `PROMISE_SECONDS` pass (the pod was deleted, or went elsewhere). A pod admitted
but never stored (refused later in admission: a ResourceQuota, another webhook, PodSecurity) gives
its promise back once the pending-pod watch has not seen it for `APPEAR_SECONDS`
(`track_appearance`, set by webhook/waiting.py: without the watch nothing could say it appeared).

Promises are shared between webhook replicas through the pods themselves: every replica's
pending-pod watch sees every converted pod, with its decision annotation (class and units). A pod
that appears without one of this replica's conversions of its class and size waiting for it
(`appeared` is False) was converted by another replica, and is promised here too (`promise_seen`)
until it is bound, unschedulable or deleted unbound, or its units show in the labels; so each
replica steers knowing what all of them admitted, and a drop in the labels consumes promises
whichever replica made them. Until its watch has listed, a replica steers by its own promises
alone (gpuslice_webhook_shared_promises says which).

A module of its own because the ledger knows nothing of nodes: it is told of conversions, of pods
seen, and of drops in a class's labelled free units (webhook/cluster.py's `ClusterView` owns one
and tells it), and read once per admission (`outstanding`), so it is kept and tested alone.

No I/O: it reads a monotonic clock (the simulator and the tests pass their own). May import the
standard library only.
"""

from __future__ import annotations

import collections
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["APPEAR_SECONDS", "PROMISE_SECONDS", "Ledger"]

# How long a conversion counts against its class when no label shows it: longer than a loaded
# scheduler takes to bind a burst's last pod, short enough that a pod that never ran is forgotten.
PROMISE_SECONDS = 300.0
# How long after its admission a converted pod must be in the API server (the webhook's watch sees
# it) before its promise is given back: later webhooks and admission plugins have a 30 s limit.
APPEAR_SECONDS = 30.0


class Ledger:
    """Units and CPU promised per GPU class (memory MiB) to converted pods not yet seen in labels."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # Class memory MiB -> promises not yet seen in labels, oldest first:
        # [deadline, units, CPU millicores per unit].
        self._promised: dict[int, collections.deque[list[float]]] = {}
        self._promised_total: Counter[int] = Counter()  # their units per class, kept as they change
        self._promised_cpu: dict[int, float] = collections.defaultdict(float)  # their CPU per class
        self._next_deadline = math.inf  # no promise expires before this (`outstanding`)
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

    def clear(self) -> None:
        """Forget every promise and every conversion waiting to appear (the counters stay)."""
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

    def seen(self, memory_mib: int, decrease: int) -> None:
        """The class's labelled free units dropped by `decrease`: that many promised units are
        now in the labels (oldest promises first)."""
        queue = self._promised.get(memory_mib)
        while queue and decrease > 0:
            decrease -= self._take(memory_mib, queue[0], decrease)
            if queue[0][1] <= 0:
                queue.popleft()

    def outstanding(self) -> tuple[Mapping[int, int], Mapping[int, float]]:
        """(units, CPU millicores) promised per class and not yet seen in labels, expired promises
        dropped: the ledger's own mappings, not to be changed. Cheap while none expires: every
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
