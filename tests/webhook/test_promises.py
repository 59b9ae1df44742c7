"""The promise ledger (webhook/promises.py) alone, on a clock of its own: what converted pods hold
until the labels show it, and how it is given back. Through the view and the pending-pod watch:
tests/webhook/test_admission.py and test_waiting.py."""

from __future__ import annotations

import random

from gpuslice.webhook import promises

H100, H200 = 81559, 143771


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def decision(memory: int, units: int, **more: object) -> dict[str, object]:
    return {"classMemoryMiB": memory, "units": units, **more}


def test_a_promise_holds_units_and_cpu_until_the_labels_show_it_oldest_first() -> None:
    ledger = promises.Ledger(Clock())
    ledger.promise(H100, 100, cpu_milli=1000)
    ledger.promise(H100, 50, cpu_milli=2000)
    units, cpu = ledger.outstanding()
    assert units[H100] == 150 and cpu[H100] == 3000
    ledger.seen(H100, 120)  # the first promise, and 20 units of the second, are in the labels
    units, cpu = ledger.outstanding()
    assert units[H100] == 30 and cpu[H100] == 30 * 2000 / 50
    ledger.seen(H100, 1000)  # more than was promised: the rest was someone else's
    units, cpu = ledger.outstanding()
    assert units[H100] == 0 and cpu[H100] == 0.0


def test_promises_expire_after_promise_seconds() -> None:
    clock = Clock()
    ledger = promises.Ledger(clock)
    ledger.promise(H100, 10)
    clock.now = 100.0
    ledger.promise(H100, 20, cpu_milli=400)
    clock.now = promises.PROMISE_SECONDS - 1
    assert ledger.outstanding()[0][H100] == 30
    clock.now = promises.PROMISE_SECONDS
    assert ledger.outstanding() == ({H100: 20}, {H100: 400})
    clock.now = 100.0 + promises.PROMISE_SECONDS
    assert ledger.outstanding() == ({H100: 0}, {H100: 0.0})


def test_a_released_conversion_gives_back_the_newest_promises_of_its_class() -> None:
    ledger = promises.Ledger(Clock())
    ledger.promise_conversion(decision(H100, 100), 1000)
    ledger.promise_conversion(decision(H100, 40), 4000)
    ledger.promise_conversion(decision(H200, 40), 400)
    ledger.release_conversion(decision(H100, 60))  # the newest (40) and 20 of the one before
    units, cpu = ledger.outstanding()
    assert units[H100] == 80 and cpu[H100] == 800 and units[H200] == 40
    for nothing in (None, {}, decision(H100, 80, migProfile="1g.10gb"), {"classMemoryMiB": H100}):
        ledger.release_conversion(nothing)
        ledger.promise_conversion(nothing, 1000)
    assert ledger.outstanding()[0][H100] == 80


def test_mig_and_unpinned_conversions_promise_nothing() -> None:
    ledger = promises.Ledger(Clock())
    ledger.promise_conversion(decision(H100, 80, migProfile="1g.10gb"))
    ledger.promise_conversion({"units": 80})  # no class pin
    ledger.promise_conversion(decision(H100, 0))
    ledger.promise_seen(decision(H100, 80, migProfile="1g.10gb"))
    assert ledger.promised_units(H100) == 0 and ledger.outstanding() == ({}, {})
    assert ledger.appeared(decision(H100, 80, migProfile="1g.10gb"))  # nothing was waiting either way


def test_own_conversions_appear_and_other_replicas_are_promised_here_too() -> None:
    ledger = promises.Ledger(Clock())
    ledger.record_appearance = True
    ledger.promise_conversion(decision(H100, 159))
    assert ledger.appeared(decision(H100, 159))  # this replica's own
    assert not ledger.appeared(decision(H100, 159))  # none left waiting: another replica's
    ledger.promise_seen(decision(H100, 159), 159 * 3)  # a whole number per unit: the sum stays exact
    assert ledger.promised_units(H100) == 2 * 159 and ledger.promised_from_others == 1
    assert ledger.outstanding()[1][H100] == 159 * 3


def test_a_conversion_that_never_appears_is_given_back_once_the_watch_has_listed() -> None:
    clock = Clock()
    ledger = promises.Ledger(clock)
    ledger.record_appearance = True
    ledger.promise_conversion(decision(H100, 159))  # before the first list: forgotten, kept
    clock.now = promises.APPEAR_SECONDS
    assert ledger.outstanding()[0][H100] == 159 and ledger.not_created == 0
    ledger.track_appearance = True
    ledger.promise_conversion(decision(H100, 159))  # never stored
    ledger.promise_conversion(decision(H100, 159))  # stored:
    assert ledger.appeared(decision(H100, 159))
    clock.now += promises.APPEAR_SECONDS - 1
    assert ledger.outstanding()[0][H100] == 3 * 159
    clock.now += 1
    assert ledger.outstanding()[0][H100] == 2 * 159 and ledger.not_created == 1


def test_clear_forgets_every_promise_and_every_conversion_waiting_to_appear() -> None:
    clock = Clock()
    ledger = promises.Ledger(clock)
    ledger.record_appearance = ledger.track_appearance = True
    ledger.promise_conversion(decision(H100, 159), 1000)
    ledger.clear()
    assert ledger.outstanding() == ({}, {}) and not ledger.appeared(decision(H100, 159))
    clock.now = promises.APPEAR_SECONDS + 1
    ledger.promise(H200, 1)
    assert ledger.outstanding()[0] == {H200: 1} and ledger.not_created == 0


def test_the_ledger_equals_a_count_promise_by_promise_through_any_sequence() -> None:
    """Promises made, seen in the labels (oldest first), released (newest first) and expired, in
    any order: what is outstanding per class is what a list of the promises, kept plainly, sums."""
    rng = random.Random(23)
    clock = Clock()
    ledger = promises.Ledger(clock)
    kept: dict[int, list[list[float]]] = {H100: [], H200: []}  # per class: [deadline, units, CPU per unit]
    for step in range(3000):
        memory = rng.choice([H100, H200])
        choice = rng.random()
        if choice < 0.4:
            units, per_unit = rng.randrange(0, 300), rng.choice([0, 5, 10])
            ledger.promise(memory, units, cpu_milli=units * per_unit)
            if units:
                kept[memory].append([clock.now + promises.PROMISE_SECONDS, units, per_unit])
        elif choice < 0.6:
            drop = rng.randrange(0, 400)
            ledger.seen(memory, drop)
            while kept[memory] and drop > 0:
                taken = min(drop, kept[memory][0][1])
                kept[memory][0][1] -= taken
                drop -= int(taken)
                if not kept[memory][0][1]:
                    kept[memory].pop(0)
        elif choice < 0.8:
            give = rng.randrange(0, 400)
            ledger.release_conversion(decision(memory, give))
            while kept[memory] and give > 0:
                taken = min(give, kept[memory][-1][1])
                kept[memory][-1][1] -= taken
                give -= int(taken)
                if not kept[memory][-1][1]:
                    kept[memory].pop()
        else:
            clock.now += rng.choice([1.0, 30.0, promises.PROMISE_SECONDS / 3])
        for queue in kept.values():
            queue[:] = [p for p in queue if p[0] > clock.now]
        units_now, cpu_now = ledger.outstanding()
        for memory, queue in kept.items():
            assert units_now.get(memory, 0) == sum(p[1] for p in queue), step
            assert cpu_now.get(memory, 0.0) == sum(p[1] * p[2] for p in queue), step
            assert ledger.promised_units(memory) == sum(p[1] for p in queue), step
