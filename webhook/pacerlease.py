"""Whether a pacer is alive, read from the Lease the leading controller renews (controller/leader.py),
for the cluster view.

With `pacing.enabled` the webhook gates pods only while a pacer (the controller's leader) is
alive: a gate nobody removes would hold every new pod the webhook touches, cluster-wide. `run()`
reads the Lease every couple of seconds and tells the view (`ClusterView.set_pacer`), which starts
a new generation at each change so that no remembered answer of the other state is given again
(webhook/repeats.py).

A pacer is alive until `leaseDurationSeconds` (the pacer's own word) after the last renewal this
webhook saw, by this webhook's monotonic clock: a renewal counts from when a read first shows it,
so the two clocks need not agree. Only the first read, with nothing to compare, judges the
`renewTime` by this webhook's wall clock (a Lease left by a pacer gone for an hour is not taken
for a live one): a pacer whose clock is behind then counts from its next renewal. A missing Lease
means no pacer, and so does one with no holder (a leader gives it up when it stops); a Lease
that cannot be read keeps the last judgement until it lapses.

The Lease's reading and the rule for when a renewal lapses are gpuslice/lease.py's, shared with
the controller's election. May import gpuslice.lease, the webhook's cluster module and the
kubernetes client.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import kubernetes

from gpuslice import lease as lease_
from gpuslice.webhook import cluster as cluster_

__all__ = ["LeaseReader", "PacerLease"]

log = logging.getLogger(__name__)


class LeaseReader(Protocol):
    """The one call of kubernetes.client.CoordinationV1Api this module makes (tests pass a fake)."""

    def read_namespaced_lease(self, name: str, namespace: str) -> Any: ...


def _wall() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class PacerLease:
    """Reads Lease `namespace`/`name` every `interval` seconds and keeps `view` told (`check()` is one read)."""

    def __init__(
        self,
        api: LeaseReader,
        view: cluster_.ClusterView,
        *,
        name: str,
        namespace: str,
        lease_seconds: int,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = _wall,
    ) -> None:
        self.api = api
        self.view = view
        self.name = name
        self.namespace = namespace
        self.lease_seconds = lease_seconds  # when the Lease does not say its duration
        self.interval = min(2.0, lease_seconds / 3)
        self.monotonic = monotonic
        self.wall = wall
        self._renewals = lease_.Renewals()  # the last renewal read, and when
        self._duration = lease_seconds
        self._read_failing = False
        self._told: bool | None = None  # the state last logged: one line per change

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def run(self) -> None:
        log.info("pods are gated only while a pacer renews Lease %s", self.lease)
        while True:
            await self.check()
            await asyncio.sleep(self.interval)

    async def check(self) -> None:
        """Read the Lease once and tell the view whether a pacer is alive."""
        try:
            lease = await asyncio.to_thread(self.api.read_namespaced_lease, self.name, self.namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                self._renewals.forget()
                self._judge(f"no pacer alive: Lease {self.lease} not found (no pacer has run)")
                return
            self._unread(f"HTTP {exc.status} {exc.reason or ''}".strip())
        except Exception as exc:  # noqa: BLE001 - the API server unreachable: try again shortly
            self._unread(f"{type(exc).__name__}: {exc}")
        else:
            self._read(lease)
        self._judge(f"no pacer alive: Lease {self.lease} not renewed within {self._duration} s")

    def _read(self, lease: Any) -> None:
        if self._read_failing:
            log.info("Lease %s read again", self.lease)
            self._read_failing = False
        observed = lease_.observe(lease)
        self._duration = lease_.duration_of(observed, self.lease_seconds)
        if not observed.holder:  # given up by a leader that stopped (controller/leader.py): nobody paces
            self._renewals.forget()
            return
        if not isinstance(observed.renew_time, datetime.datetime):
            return  # never renewed: nothing seen
        # The first read, with nothing to compare: how old it is, by this webhook's wall clock.
        age = lease_.age_of(observed.renew_time, self.wall()) if self._renewals.seen is None else 0.0
        self._renewals.saw(observed.renewal, self.monotonic(), age=age)

    def _unread(self, why: str) -> None:
        # Once per run of failures at warning: a read is every couple of seconds.
        (log.debug if self._read_failing else log.warning)(
            "cannot read Lease %s (a pacer counts as alive until its last renewal lapses): %s", self.lease, why
        )
        self._read_failing = True

    def _judge(self, absent: str) -> None:
        alive = self._renewals.held(self.monotonic(), self._duration)
        self.view.set_pacer("" if alive else absent)
        if alive is not self._told:
            if alive:
                log.info("pacer alive (Lease %s renewed): pods are gated for it", self.lease)
            else:
                log.warning("%s: pods are not gated", absent)
            self._told = alive
