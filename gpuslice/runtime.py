"""One runtime for every gpuslice process: runnables under a supervisor, in the spirit of
controller-runtime's manager.

A process's main builds its runnables in order and hands them to a `Supervisor`, which:

* serves the one health and metrics app, when the process has a port for it (`Health`):
  /healthz answers while the process runs, /readyz says which checks pass (by default, each
  runnable's `ready()`), /metrics is the process's prometheus-client registry;
* starts the runnables in order (`start()`: bind, register, prepare; an error there is the
  process's start-up error, raised as it is once the runnables already started are stopped),
  then runs each one's `run()` as a named task;
* serves until SIGTERM or SIGINT (or the `stop` event a test sets), or until a runnable's task
  fails: then every runnable is stopped and `RunnableFailed` names the one that failed;
* stops them in reverse order: its task cancelled and awaited, then its `stop()`, each within a
  bounded grace (one that overruns is logged and left), the health app last.

Leader election is a wrapper: `LeaderElection` campaigns (once the views it waits for are
current) through an `Election` such as controller/leader.py's. What acts only while leading asks
the election (`leading`, `watch`) rather than being started and stopped with the Lease, so a
standby's watches stay current and a takeover acts at once. The Lease protocol itself is
gpuslice/lease.py's.

May import aiohttp, prometheus_client and the standard library; no other gpuslice module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import prometheus_client
from aiohttp import web

__all__ = [
    "Component",
    "Election",
    "Health",
    "LeaderElection",
    "Runnable",
    "RunnableFailed",
    "Supervisor",
    "health_app",
]

log = logging.getLogger(__name__)

GRACE_SECONDS = 20.0  # what one runnable gets to stop (a pod's default termination grace is 30 s)


class Runnable(Protocol):
    """One part of a process. `start()` returns once it serves (or raises: the process must not
    run); `run()` is its work until cancelled (returning early is fine, raising stops the process);
    `ready()` is polled by /readyz; `stop()` undoes `start()` after `run()` is cancelled."""

    @property
    def name(self) -> str: ...

    async def start(self) -> None: ...

    async def run(self) -> None: ...

    def ready(self) -> bool: ...

    async def stop(self) -> None: ...


async def _nothing() -> None:
    return None


async def _forever() -> None:
    await asyncio.Event().wait()


class Component:
    """A runnable made of callables, for parts that have a start and a stop (servers), a loop, or both."""

    def __init__(
        self,
        name: str,
        *,
        start: Callable[[], Awaitable[None]] = _nothing,
        run: Callable[[], Awaitable[None]] = _forever,
        stop: Callable[[], Awaitable[None]] = _nothing,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self._name = name
        self._start, self._run, self._stop, self._ready = start, run, stop, ready

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        await self._start()

    async def run(self) -> None:
        await self._run()

    def ready(self) -> bool:
        return self._ready()

    async def stop(self) -> None:
        await self._stop()


class RunnableFailed(Exception):
    """A runnable's `run()` raised while the process served: the process stops."""

    def __init__(self, name: str, cause: BaseException) -> None:
        super().__init__(f"{name} failed: {type(cause).__name__}: {cause}")
        self.name = name
        self.cause = cause


@dataclasses.dataclass(frozen=True)
class Health:
    """The health and metrics app: on `host`:`port` (plain HTTP: nothing secret), `registry` at
    /metrics, and /readyz 200 once every check of `checks` passes (default: each runnable's
    `ready()`, by name); a 503 says `waiting` and the checks that do not pass yet, or `empty`
    when there are no checks."""

    port: int
    registry: prometheus_client.CollectorRegistry
    host: str = "0.0.0.0"
    checks: Callable[[], Mapping[str, bool]] | None = None
    waiting: str = "not ready"
    empty: str = "nothing to run"


def health_app(
    registry: prometheus_client.CollectorRegistry,
    checks: Callable[[], Mapping[str, bool]],
    *,
    waiting: str = "not ready",
    empty: str = "nothing to run",
) -> web.Application:
    """/healthz, /readyz and /metrics (see `Health`)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        state = checks()
        missing = sorted(name for name, ok in state.items() if not ok)
        if state and not missing:
            return web.Response(text="ready: " + ", ".join(sorted(state)) + "\n")
        reason = f"{waiting}: " + ", ".join(missing) if missing else empty
        return web.Response(status=503, text=reason + "\n")

    async def metrics(_: web.Request) -> web.Response:
        body = prometheus_client.generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


class Supervisor:
    """Runs `runnables` (see the module's docstring) until stopped; `started` is called once all
    of them have started (a process's "serving" line)."""

    def __init__(
        self,
        runnables: Sequence[Runnable],
        *,
        health: Health | None = None,
        stop: asyncio.Event | None = None,
        grace: float = GRACE_SECONDS,
        started: Callable[[], None] | None = None,
    ) -> None:
        self.runnables = tuple(runnables)
        self.health = health
        self.stop = stop or asyncio.Event()
        self.grace = grace
        self.started = started

    def ready(self) -> dict[str, bool]:
        return {runnable.name: runnable.ready() for runnable in self.runnables}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signalled, sig)
        started: list[tuple[Runnable, asyncio.Task[None]]] = []
        http: web.AppRunner | None = None
        try:
            if self.health is not None:
                http = await self._serve_health(self.health)
            for runnable in self.runnables:
                await runnable.start()
                started.append((runnable, asyncio.create_task(runnable.run(), name=runnable.name)))
            if self.started is not None:
                self.started()
            await self._serve(dict((task, runnable.name) for runnable, task in started))
        finally:
            for runnable, task in reversed(started):
                await self._stop_one(runnable, task)
            if http is not None:
                await http.cleanup()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def _signalled(self, sig: signal.Signals) -> None:
        if not self.stop.is_set():
            log.info("%s: stopping", sig.name)
        self.stop.set()

    async def _serve(self, tasks: dict[asyncio.Task[None], str]) -> None:
        """Until `stop` is set or a task fails (RunnableFailed); a task that returns is done."""
        stopping = asyncio.create_task(self._stopped(), name="supervisor-stop")
        running = set(tasks)
        try:
            while True:
                done, running = await asyncio.wait({*running, stopping}, return_when=asyncio.FIRST_COMPLETED)
                running.discard(stopping)
                for task in done - {stopping}:
                    cause = None if task.cancelled() else task.exception()
                    if cause is not None:
                        log.error("%s failed: stopping", tasks[task], exc_info=cause)
                        raise RunnableFailed(tasks[task], cause) from cause
                if stopping in done:
                    return
        finally:
            stopping.cancel()
            await asyncio.gather(stopping, return_exceptions=True)

    async def _stopped(self) -> None:
        await self.stop.wait()

    async def _stop_one(self, runnable: Runnable, task: asyncio.Task[None]) -> None:
        task.cancel()
        await asyncio.wait({task}, timeout=self.grace)
        if not task.done():
            log.warning("%s did not end within %.0f s of its cancellation", runnable.name, self.grace)
        stopping = asyncio.create_task(runnable.stop(), name=f"{runnable.name}-stop")
        await asyncio.wait({stopping}, timeout=self.grace)
        if not stopping.done():
            log.warning("%s did not stop within %.0f s: left", runnable.name, self.grace)
            stopping.cancel()
            await asyncio.gather(stopping, return_exceptions=True)
        elif not stopping.cancelled() and stopping.exception() is not None:
            log.error("%s did not stop cleanly", runnable.name, exc_info=stopping.exception())

    async def _serve_health(self, health: Health) -> web.AppRunner:
        checks = health.checks or self.ready
        app = health_app(health.registry, checks, waiting=health.waiting, empty=health.empty)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, health.host, health.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        return runner


class Election(Protocol):
    """An election (controller/leader.py's Leadership): it campaigns in `run()` until cancelled
    (giving the Lease up then); the runnables that act only while leading read `leading` and are
    called back through `watch` at each change."""

    @property
    def leading(self) -> bool: ...

    def watch(self, callback: Callable[[bool], None]) -> None: ...

    async def run(self) -> None: ...


class LeaderElection(Component):
    """Campaigns through `election` once `after()` holds (the views a leader acts from are
    current: it acts from the moment it is elected); `announce` is logged when it begins."""

    def __init__(
        self, election: Election, *, after: Callable[[], bool] = lambda: True, announce: str = "", poll: float = 0.2
    ) -> None:
        super().__init__("leader-election", run=self._campaign, ready=lambda: True)
        self.election = election
        self.after = after
        self.announce = announce
        self.poll = poll

    async def _campaign(self) -> None:
        while not self.after():
            await asyncio.sleep(self.poll)
        if self.announce:
            log.info("%s", self.announce)
        await self.election.run()
