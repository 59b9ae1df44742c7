"""kube-scheduler kept running through a replay (sim/keeper.py): an exit is noticed and the process
started again, recorded with its status and how long the new one took; a start that fails is an
error and is tried again; the replay's end waits for a start under way. A real kube-scheduler killed
in a real replay: tests/e2e/test_real_replay.py."""

from __future__ import annotations

import asyncio
import subprocess
import threading

import pytest

from gpuslice.sim import controlplane, keeper


class _Process:
    def __init__(self) -> None:
        self.popen = subprocess.Popen(["sleep", "60"], start_new_session=True)  # noqa: S607 - coreutils


class _Starts:
    """start(): a new process each time, after failing the first `failures` times."""

    def __init__(self, failures: int = 0, pause: float = 0.0) -> None:
        self.failures = failures
        self.pause = pause
        self.started: list[_Process] = []
        self.calls = 0
        self.entered = threading.Event()

    def __call__(self) -> _Process:
        self.calls += 1
        self.entered.set()
        threading.Event().wait(self.pause)
        if self.calls <= self.failures:
            raise controlplane.ControlPlaneError("kube-scheduler exited with status 1:\nbind: address in use")
        process = _Process()
        self.started.append(process)
        return process

    def stop_all(self, *others: _Process) -> None:
        for process in [*self.started, *others]:
            process.popen.kill()
            process.popen.wait()


async def _until(condition: object, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper, "LOOK_SECONDS", 0.01)
    monkeypatch.setattr(keeper, "BACKOFF_SECONDS", (0.01,))


async def test_an_exit_is_noticed_and_the_process_started_again() -> None:
    first, starts = _Process(), _Starts()
    kept = keeper.Keeper("kube-scheduler", first, starts)
    try:
        async with kept.watching():
            await asyncio.sleep(0.05)
            assert kept.restarts == [] and starts.calls == 0  # running: left alone
            first.popen.kill()
            await _until(lambda: kept.restarts and kept.restarts[0]["ready_after_s"] is not None)
            assert kept.process is starts.started[0] and kept.process.popen.poll() is None
            kept.process.popen.kill()  # and again: each exit is one restart
            await _until(lambda: len(starts.started) == 2 and kept.restarts[1]["ready_after_s"] is not None)
    finally:
        starts.stop_all(first)
    assert [r["status"] for r in kept.restarts] == [-9, -9]
    assert kept.restarts[0]["at_s"] < kept.restarts[1]["at_s"]
    assert kept.errors == []


async def test_a_failed_start_is_an_error_and_is_tried_again() -> None:
    first, starts = _Process(), _Starts(failures=2)
    kept = keeper.Keeper("kube-scheduler", first, starts)
    first.popen.kill()
    try:
        async with kept.watching():
            await _until(lambda: starts.started)
    finally:
        starts.stop_all(first)
    assert starts.calls == 3
    assert len(kept.errors) == 2
    assert "kube-scheduler did not start again after it exited (-9)" in kept.errors[0]
    assert "address in use" in kept.errors[0]
    [restart] = kept.restarts
    assert restart["status"] == -9 and restart["ready_after_s"] is not None


async def test_the_end_waits_for_a_start_under_way_so_no_process_is_left_unknown() -> None:
    # A start still in its thread when the replay ends would otherwise leave a scheduler nobody stops.
    first, starts = _Process(), _Starts(pause=0.3)
    kept = keeper.Keeper("kube-scheduler", first, starts)
    first.popen.kill()
    try:
        async with kept.watching():
            await asyncio.to_thread(starts.entered.wait, 10)
        assert kept.process is starts.started[0]  # the block ended after the start finished
        [restart] = kept.restarts
        assert restart["ready_after_s"] >= 0.3
    finally:
        starts.stop_all(first)


async def test_nothing_is_restarted_after_the_block() -> None:
    first, starts = _Process(), _Starts()
    kept = keeper.Keeper("kube-scheduler", first, starts)
    try:
        async with kept.watching():
            await asyncio.sleep(0.03)
        first.popen.kill()
        first.popen.wait()
        await asyncio.sleep(0.05)
    finally:
        starts.stop_all(first)
    assert starts.calls == 0 and kept.restarts == []
