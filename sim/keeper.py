"""kube-scheduler kept running through a replay, as kubelet keeps the static pod it runs in.

kube-scheduler exits by design when an update shows a pod it holds on another node, and relies on
being restarted: in a cluster kubelet does that, with a back-off. A loaded machine brings that
about: the API server closes a slow pod watch, and a pod recreated under its name before the relist
reaches the scheduler as an update of the old one (docs/benchmarks.md, "kube-scheduler killed").
The replay's control plane has no kubelet for it, so a `Keeper` watches the process and starts a
new one when it exits (a crash, that exit, or `--chaos kill-scheduler`). Each restart is recorded;
a start that fails is an error and is tried again after a back-off, as kubelet's CrashLoopBackOff
does (shorter here).

May import the standard library and gpuslice.sim.controlplane.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from gpuslice.sim import controlplane

__all__ = ["Keeper"]

LOOK_SECONDS = 0.25  # how often the process is looked at
BACKOFF_SECONDS = (1.0, 2.0, 4.0, 8.0)  # after a failed start: then the last one, again and again


class Keeper:
    """Keeps `process` running: when it exits, `start()` (blocking; returns the new process, or raises
    ControlPlaneError) is called in a thread. `restarts` says what happened, `errors` which starts failed."""

    def __init__(self, name: str, process: Any, start: Callable[[], Any]) -> None:
        self.name = name
        self.process = process  # controlplane's process handle: the one running now
        self._start = start
        self.restarts: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.origin = time.monotonic()  # the moment a restart's `at_s` counts from (the replay's first create)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[Keeper]:
        """Keep the process running inside the block."""
        task = asyncio.create_task(self._keep(), name=f"keep-{self.name}")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(LOOK_SECONDS)
            status = self.process.popen.poll()
            if status is None:
                continue
            exited = time.monotonic()
            record: dict[str, Any] = {
                "at_s": round(exited - self.origin, 3),
                "status": status,
                "ready_after_s": None,
            }
            self.restarts.append(record)
            failures = 0
            while True:
                # Shielded: a cancel mid-start still waits for the start to finish, so the new process
                # is in the control plane's list before anyone stops the plane.
                start = asyncio.ensure_future(asyncio.to_thread(self._start))
                try:
                    self.process = await asyncio.shield(start)
                except asyncio.CancelledError:
                    with contextlib.suppress(Exception):
                        self.process = await start
                        record["ready_after_s"] = round(time.monotonic() - exited, 3)
                    raise
                except controlplane.ControlPlaneError as exc:
                    self.errors.append(f"{self.name} did not start again after it exited ({status}): {exc}")
                    await asyncio.sleep(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)])
                    failures += 1
                    continue
                record["ready_after_s"] = round(time.monotonic() - exited, 3)
                break
