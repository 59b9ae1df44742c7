"""gpuslice.timeouts: a wait with a limit that says whether it finished and never loses a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from gpuslice import timeouts


async def test_it_says_whether_the_wait_finished_in_time() -> None:
    done = asyncio.Event()
    assert not await timeouts.wait_at_most(done.wait(), 0.01)
    done.set()
    assert await timeouts.wait_at_most(done.wait(), 0.01)
    assert await timeouts.wait_at_most(done.wait(), -1)  # no time left: what is already done still counts


async def test_a_cancel_in_the_moment_the_wait_ends_stops_the_loop_that_waits() -> None:
    # asyncio.wait_for on 3.11 returns normally here, and the loop runs on (python/cpython#86296).
    wake = asyncio.Event()

    async def waits_for_changes() -> None:
        while True:
            await timeouts.wait_at_most(wake.wait(), 10)
            wake.clear()

    task = asyncio.create_task(waits_for_changes())
    await asyncio.sleep(0.01)
    wake.set()
    await asyncio.sleep(0)  # the event's waiter is done ...
    task.cancel()  # ... as the task is cancelled
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task


async def test_what_it_waits_on_is_cancelled_when_the_time_runs_out() -> None:
    started = asyncio.Event()
    outcome: list[str] = []

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    assert not await timeouts.wait_at_most(slow(), 0.05)
    assert started.is_set() and outcome == ["cancelled"]
