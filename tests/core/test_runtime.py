"""The runtime every process runs under (gpuslice/runtime.py): ordered start and shutdown, a failing
runnable stopping the process, readiness and metrics over real HTTP, signals, and leader election
as a wrapper. The processes over it: tests/deviceplugin/test_main.py, tests/dra/test_main.py,
tests/webhook/test_main.py."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable

import aiohttp
import prometheus_client
import pytest

from gpuslice import runtime

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")


class Recorder:
    """Runnables that write what happens to them into one shared list."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def part(
        self,
        name: str,
        *,
        fail_start: Exception | None = None,
        fail_run: Exception | None = None,
        run_returns: bool = False,
        stop: Callable[[], object] | None = None,
        ready: Callable[[], bool] = lambda: True,
    ) -> runtime.Component:
        async def start() -> None:
            self.events.append(f"start {name}")
            if fail_start is not None:
                raise fail_start

        async def run() -> None:
            self.events.append(f"run {name}")
            if fail_run is not None:
                await asyncio.sleep(0.01)
                raise fail_run
            if run_returns:
                return
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.events.append(f"cancel {name}")
                raise

        async def stopped() -> None:
            self.events.append(f"stop {name}")
            if stop is not None:
                result = stop()
                if asyncio.iscoroutine(result):
                    await result

        return runtime.Component(name, start=start, run=run, stop=stopped, ready=ready)


async def serve_until(supervisor: runtime.Supervisor, condition: Callable[[], bool]) -> None:
    task = asyncio.create_task(supervisor.run(), name="supervisor-under-test")
    for _ in range(200):
        if condition() or task.done():
            break
        await asyncio.sleep(0.01)
    supervisor.stop.set()
    await task


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- order -----------------------------------------------------------------------------------


async def test_runnables_start_in_order_and_stop_in_reverse_each_cancelled_before_its_stop() -> None:
    parts = Recorder()
    runnables = [parts.part("a"), parts.part("b"), parts.part("c")]
    started: list[str] = []
    supervisor = runtime.Supervisor(runnables, started=lambda: started.append("all"))
    await serve_until(supervisor, lambda: parts.events.count("run c") == 1)
    assert started == ["all"]
    starts = [e for e in parts.events if e.startswith("start")]
    assert starts == ["start a", "start b", "start c"]
    shutdown = [e for e in parts.events if e.startswith(("cancel", "stop"))]
    assert shutdown == ["cancel c", "stop c", "cancel b", "stop b", "cancel a", "stop a"]


async def test_a_start_that_fails_stops_those_started_and_raises_the_error_as_it_is() -> None:
    parts = Recorder()
    runnables = [parts.part("a"), parts.part("b", fail_start=OSError("port in use")), parts.part("c")]
    with pytest.raises(OSError, match="port in use"):
        await runtime.Supervisor(runnables).run()
    assert "start c" not in parts.events and "stop b" not in parts.events  # b never started
    assert parts.events[-1] == "stop a"


async def test_a_runnable_that_fails_stops_the_process_with_an_error_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parts = Recorder()
    runnables = [parts.part("a"), parts.part("labeller", fail_run=ValueError("bad label")), parts.part("c")]
    with pytest.raises(runtime.RunnableFailed) as failed:
        await runtime.Supervisor(runnables).run()
    assert str(failed.value) == "labeller failed: ValueError: bad label"
    assert failed.value.name == "labeller" and isinstance(failed.value.cause, ValueError)
    assert [e for e in parts.events if e.startswith("stop")] == ["stop c", "stop labeller", "stop a"]
    assert any(r.levelno == logging.ERROR and "labeller failed" in r.getMessage() for r in caplog.records)


async def test_a_runnable_whose_run_returns_is_done_and_the_rest_serve_on() -> None:
    parts = Recorder()
    supervisor = runtime.Supervisor([parts.part("once", run_returns=True), parts.part("server")])
    task = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0.05)
    assert not task.done()
    supervisor.stop.set()
    await task
    assert [e for e in parts.events if e.startswith("stop")] == ["stop server", "stop once"]


async def test_a_stop_that_overruns_the_grace_is_left_and_the_rest_still_stop(caplog: pytest.LogCaptureFixture) -> None:
    parts = Recorder()
    runnables = [parts.part("a"), parts.part("slow", stop=lambda: asyncio.sleep(30))]
    supervisor = runtime.Supervisor(runnables, grace=0.05)
    await serve_until(supervisor, lambda: "run slow" in parts.events)
    assert parts.events[-2:] == ["cancel a", "stop a"]
    assert any("slow did not stop within" in r.getMessage() for r in caplog.records)


async def test_a_stop_that_raises_is_logged_and_the_rest_still_stop(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("socket gone")

    parts = Recorder()
    supervisor = runtime.Supervisor([parts.part("a"), parts.part("b", stop=broken)])
    await serve_until(supervisor, lambda: "run b" in parts.events)
    assert parts.events[-1] == "stop a"
    assert any("b did not stop cleanly" in r.getMessage() for r in caplog.records)


# --- signals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_sigterm_and_sigint_stop_the_process_in_order(sig: signal.Signals) -> None:
    parts = Recorder()
    supervisor = runtime.Supervisor([parts.part("a"), parts.part("b")])
    task = asyncio.create_task(supervisor.run())
    for _ in range(100):
        if "run b" in parts.events:
            break
        await asyncio.sleep(0.01)
    os.kill(os.getpid(), sig)
    await asyncio.wait_for(task, 5)
    assert [e for e in parts.events if e.startswith("stop")] == ["stop b", "stop a"]
    # The handlers go with the supervisor: the loop no longer owns the signals.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# --- health, readiness, metrics --------------------------------------------------------------


async def test_readyz_follows_each_runnables_readiness_and_metrics_shows_the_registry() -> None:
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("gpuslice_test_things", "Things", registry=registry).inc(3)
    listed = {"pacer": False}
    parts = Recorder()
    runnables = [parts.part("requeuer"), parts.part("pacer", ready=lambda: listed["pacer"])]
    port = free_port()
    supervisor = runtime.Supervisor(runnables, health=runtime.Health(port=port, host="127.0.0.1", registry=registry))
    task = asyncio.create_task(supervisor.run())
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                        assert (r.status, await r.text()) == (200, "ok\n")
                    break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.02)
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert (r.status, await r.text()) == (503, "not ready: pacer\n")
            listed["pacer"] = True
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert (r.status, await r.text()) == (200, "ready: pacer, requeuer\n")
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                assert "gpuslice_test_things_total 3.0" in await r.text()
                assert r.headers["Content-Type"].startswith("text/plain")
    finally:
        supervisor.stop.set()
        await task


async def test_readyz_can_name_what_it_waits_for_and_says_when_there_is_nothing(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    state: dict[str, bool] = {}
    registry = prometheus_client.CollectorRegistry()
    app = runtime.health_app(registry, lambda: state, waiting="not registered with kubelet", empty="nothing at all")
    client = await aiohttp_client(app)
    response = await client.get("/readyz")
    assert (response.status, await response.text()) == (503, "nothing at all\n")
    state.update({"gpu-memory": False, "mig-1g": True})
    response = await client.get("/readyz")
    assert (response.status, await response.text()) == (503, "not registered with kubelet: gpu-memory\n")


async def test_a_health_port_in_use_fails_the_start_before_any_runnable_starts() -> None:
    parts = Recorder()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        health = runtime.Health(
            port=taken.getsockname()[1], host="127.0.0.1", registry=prometheus_client.CollectorRegistry()
        )
        with pytest.raises(OSError):
            await runtime.Supervisor([parts.part("a")], health=health).run()
    assert parts.events == []


# --- leader election as a wrapper ------------------------------------------------------------


class FakeElection:
    def __init__(self) -> None:
        self.leading = False
        self.callbacks: list[Callable[[bool], None]] = []
        self.campaigning = asyncio.Event()
        self.gave_up = False

    def watch(self, callback: Callable[[bool], None]) -> None:
        self.callbacks.append(callback)

    async def run(self) -> None:
        self.campaigning.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.gave_up = True


async def test_the_campaign_begins_once_the_views_are_current_and_gives_up_on_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gpuslice.runtime")
    election, listed = FakeElection(), {"done": False}
    campaign = runtime.LeaderElection(election, after=lambda: listed["done"], announce="views listed", poll=0.01)
    supervisor = runtime.Supervisor([campaign])
    task = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0.05)
    assert not election.campaigning.is_set()
    listed["done"] = True
    await asyncio.wait_for(election.campaigning.wait(), 2)
    assert "views listed" in caplog.messages
    supervisor.stop.set()
    await task
    assert election.gave_up
