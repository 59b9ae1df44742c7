"""Chaos in a replay on the real control plane (`gpuslice-sim --scheduler kube --chaos ACTION@FRACTION`):
a process killed with SIGKILL, as a crash or an OOM kill leaves it (no Lease given up, connections
cut), once FRACTION of the run's arrivals have had their create answered.

    kill-webhook-replica@0.5     one of the webhook replicas (needs --webhook-replicas 2 or more;
                                 the round-robin proxy then passes it over, as a Service drops it)
    kill-controller-leader@0.5   the controller's leader; the replay then also runs a standby,
                                 which takes over once the leader's Lease has expired
    kill-scheduler@0.5           kube-scheduler; the replay starts it again (sim/keeper.py), as
                                 kubelet restarts the static pod it runs in

The replay (sim/kube_replay.py) arms a `Monkey` with the processes it started and runs it beside
the arrivals; each kill is recorded with its moment, for the report.

May import the standard library and gpuslice.sim.controlplane.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuslice.sim import controlplane

__all__ = ["ACTIONS", "Event", "Monkey", "Target", "check", "needs_standby", "parse"]

KILL_WEBHOOK_REPLICA = "kill-webhook-replica"
KILL_CONTROLLER_LEADER = "kill-controller-leader"
KILL_SCHEDULER = "kill-scheduler"
ACTIONS = (KILL_WEBHOOK_REPLICA, KILL_CONTROLLER_LEADER, KILL_SCHEDULER)
TAKEOVER_LOOK_SECONDS = 0.25  # how often the standby is asked whether it leads, after a leader's kill
TAKEOVER_LIMIT_SECONDS = 120.0  # longer than any Lease the chart allows to expire unnoticed


@dataclasses.dataclass(frozen=True)
class Event:
    action: str  # one of ACTIONS
    fraction: float  # of the run's arrivals whose create was answered before the kill, in (0, 1]

    def __str__(self) -> str:
        return f"{self.action}@{self.fraction:g}"


def parse(text: str) -> Event:
    """`ACTION@FRACTION` with ACTION one of ACTIONS and 0 < FRACTION <= 1 (argparse's `type`)."""
    action, at, raw = text.partition("@")
    if action not in ACTIONS or not at:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected ACTION@FRACTION with ACTION one of {', '.join(ACTIONS)}, e.g. {ACTIONS[0]}@0.5"
        )
    try:
        fraction = float(raw)
    except ValueError:
        fraction = math.nan
    if not 0 < fraction <= 1:  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"{text!r}: the fraction of the arrivals created before the kill must be in (0, 1], got {raw!r}"
        )
    return Event(action, fraction)


def check(events: Sequence[Event], *, webhook_replicas: int, controller: bool, dra: bool) -> None:
    """ValueError, saying what to change, where a run could not carry out `events`."""
    actions = [e.action for e in events]
    for action in ACTIONS:
        if actions.count(action) > 1:
            raise ValueError(f"--chaos {action} given more than once (one kill of each kind per run)")
    if KILL_WEBHOOK_REPLICA in actions and webhook_replicas < 2:
        raise ValueError(
            f"--chaos {KILL_WEBHOOK_REPLICA} needs --webhook-replicas 2 or more: with none left, the webhook's "
            "failurePolicy Fail refuses every pod"
        )
    if KILL_CONTROLLER_LEADER in actions and not controller:
        raise ValueError(
            f"--chaos {KILL_CONTROLLER_LEADER} needs the controller: requeue.enabled or pacing.enabled "
            "(--requeue-enabled true)"
        )
    if KILL_CONTROLLER_LEADER in actions and dra:
        raise ValueError(f"--chaos {KILL_CONTROLLER_LEADER}: device-plugin mode only (DRA mode runs no controller)")


@dataclasses.dataclass(frozen=True)
class Target:
    """A process the replay started: a webhook replica, kube-scheduler, or a controller replica and its
    HTTP port."""

    name: str
    process: Any  # controlplane's process handle
    port: int = 0


def needs_standby(events: Sequence[Event]) -> bool:
    """Whether the replay must run a standby controller beside the leader."""
    return any(e.action == KILL_CONTROLLER_LEADER for e in events)


class Monkey:
    """Carries out `events` on one run, in the order of their fractions; `records` says what it did."""

    def __init__(self, events: Sequence[Event], *, scheduler: Callable[[], Target] | None = None) -> None:
        """`scheduler()`: the kube-scheduler running now (a restart replaces it)."""
        self.events = sorted(events, key=lambda e: e.fraction)
        self.records: list[dict[str, Any]] = []
        self._plane: controlplane.ControlPlane | None = None
        self._webhooks: list[Target] = []
        self._controllers: list[Target] = []
        self._leading: Callable[[int], bool] = lambda port: False
        self._scheduler = scheduler
        self._takeovers = 0  # leaders killed whose successor has not led yet
        self.leaders_killed = 0

    def arm(
        self,
        plane: controlplane.ControlPlane,
        *,
        webhooks: Sequence[Target] = (),
        controllers: Sequence[Target] = (),
        leading: Callable[[int], bool] = lambda port: False,
    ) -> None:
        """The processes it may kill; `leading(port)`: whether the controller at `port` leads now."""
        self._plane = plane
        self._webhooks = list(webhooks)
        self._controllers = list(controllers)
        self._leading = leading

    async def run(self, total: int, created: Callable[[], int], started: float) -> None:
        """Kill each event's target once `created()` (creates answered) reaches its share of `total`
        arrivals; `started`: the run's first create (time.monotonic). Cancel it when the run ends."""
        async with asyncio.TaskGroup() as watches:
            for event in self.events:
                threshold = max(1, math.ceil(event.fraction * total))
                while created() < threshold:
                    await asyncio.sleep(0.005)
                record: dict[str, Any] = {"event": str(event), "after_creates": created(), "killed": None}
                self.records.append(record)
                if event.action == KILL_WEBHOOK_REPLICA:
                    target = self._webhooks[0] if len(self._webhooks) > 1 else None
                elif event.action == KILL_SCHEDULER:
                    target = self._scheduler() if self._scheduler is not None else None
                else:
                    leaders = [c for c in self._controllers if await asyncio.to_thread(self._leading, c.port)]
                    target = leaders[0] if leaders and len(self._controllers) > 1 else None
                if target is None:  # nothing of that kind here (a whole-GPU configuration has no webhook)
                    continue
                await asyncio.to_thread(self._kill, target)
                record.update(killed=target.name, at_s=round(time.monotonic() - started, 3))
                if event.action == KILL_WEBHOOK_REPLICA:
                    self._webhooks.remove(target)
                elif event.action == KILL_CONTROLLER_LEADER:
                    self._controllers.remove(target)
                    self.leaders_killed += 1
                    record["standby_leading_after_s"] = None  # until a remaining replica leads
                    watches.create_task(self._takeover(record, time.monotonic()), name="chaos-takeover")

    @property
    def waiting_for_a_leader(self) -> bool:
        """A leader was killed and no standby leads yet: the run is not over (the refused pods wait
        for the new leader to requeue them)."""
        return self._takeovers > 0

    def _kill(self, target: Target) -> None:
        try:
            os.killpg(target.process.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        assert self._plane is not None
        self._plane.stop_process(target.process)  # reaps it (SIGKILL leaves nothing to wait for)

    async def _takeover(self, record: dict[str, Any], killed_at: float) -> None:
        """Record the seconds from the kill until a remaining controller leads (None if none did in time)."""
        self._takeovers += 1
        try:
            while time.monotonic() - killed_at < TAKEOVER_LIMIT_SECONDS:
                for controller in self._controllers:
                    if await asyncio.to_thread(self._leading, controller.port):
                        record["standby_leading_after_s"] = round(time.monotonic() - killed_at, 1)
                        return
                await asyncio.sleep(TAKEOVER_LOOK_SECONDS)
        finally:
            self._takeovers -= 1
