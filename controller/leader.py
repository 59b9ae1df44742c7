"""Leader election on a coordination.k8s.io/v1 Lease: one controller replica acts, the others stand by.

Every replica lists and watches from the start (warm caches), then campaigns: it takes the Lease
when nobody holds it, when the holder gave it up, or when the holder's renewal has not moved for
`leaseDurationSeconds` by this replica's own monotonic clock (a renewal counts from when a read
first shows it, so the replicas' clocks need not agree). The leader renews every third of the
duration; a standby looks as often. Every write carries the resourceVersion last read, so of two
replicas that both see an expired Lease only one takes it (the other's write conflicts).

A leader that cannot renew for two thirds of the duration stops acting before anyone else may take
over (the duration), so two replicas never act at once; it then campaigns again like a standby.
On shutdown the leader gives the Lease up (no holder, duration 1 s), so a standby takes over at its
next look instead of after the duration: this is what makes a rolling upgrade quick.

With `pacing.enabled` the webhook gates pods only while this Lease is renewed by a holder
(webhook/pacerlease.py): the leader is the pacer.

What a read of the Lease says, when a renewal lapses and the time format are gpuslice/lease.py's,
shared with the webhook's reader. May import gpuslice.lease and the kubernetes client (in threads).
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

__all__ = ["Leadership", "LeaseApi"]

log = logging.getLogger(__name__)


class LeaseApi(Protocol):
    """The calls of kubernetes.client.CoordinationV1Api the election makes (tests pass a fake)."""

    def read_namespaced_lease(self, name: str, namespace: str) -> Any: ...

    def create_namespaced_lease(self, namespace: str, body: Any) -> Any: ...

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any) -> Any: ...


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Leadership:
    """Campaigns for Lease `namespace`/`name` as `identity` until cancelled; `leading` while it holds
    it. Callbacks given to `watch` are called on the event loop at each change of `leading`."""

    def __init__(
        self,
        api: LeaseApi,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_seconds: int,
        clock: Callable[[], datetime.datetime] = _now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.monotonic = monotonic
        self.leading = False
        self._watchers: list[Callable[[bool], None]] = []
        self._renewals = lease_.Renewals()  # the holder's last renewal read, and when
        self._renewed_at = 0.0  # monotonic time of this replica's last accepted renewal
        self._failing = False

    @property
    def interval(self) -> float:
        return self.lease_seconds / 3

    @property
    def renew_deadline(self) -> float:
        """Seconds a leader may go unrenewed before it stops acting: before any standby may take over."""
        return self.lease_seconds * 2 / 3

    def watch(self, callback: Callable[[bool], None]) -> None:
        self._watchers.append(callback)

    async def run(self) -> None:
        log.info("campaigning for Lease %s/%s as %s", self.namespace, self.name, self.identity)
        try:
            while True:
                await self.step()
                await asyncio.sleep(self.interval)
        finally:
            if self.leading:
                self._set(False)
                await asyncio.shield(self.release())

    async def step(self) -> bool:
        """One look at the Lease, taking or renewing it when this replica may; whether it leads now."""
        try:
            current = await asyncio.to_thread(self.api.read_namespaced_lease, self.name, self.namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                return self._failed(f"HTTP {exc.status}: {(exc.body or exc.reason or '')[:200]}")
            return await self._write(None, self._spec(transitions=0, acquired=True))
        except Exception as exc:  # noqa: BLE001 - the API server unreachable: look again next time
            return self._failed(f"{type(exc).__name__}: {exc}")
        observed = lease_.observe(current)
        now = self.monotonic()
        self._renewals.saw(observed.renewal, now)
        if observed.holder == self.identity:  # a renewal, or ours from an earlier run of this identity
            body = self._spec(
                transitions=observed.transitions, acquired=not self.leading, acquire_time=observed.acquire_time
            )
            return await self._write(observed.version, body)
        if observed.holder and self._renewals.held(now, lease_.duration_of(observed, self.lease_seconds)):
            if self.leading:  # someone else holds it (it took it while we could not renew): stop at once
                self._set(False)
            return False
        # Free, given up or expired: take it.
        return await self._write(observed.version, self._spec(transitions=observed.transitions + 1, acquired=True))

    async def release(self) -> None:
        """Give the Lease up (no holder, 1 s), so a standby need not wait out the duration."""
        try:
            observed = lease_.observe(
                await asyncio.to_thread(self.api.read_namespaced_lease, self.name, self.namespace)
            )
            if observed.holder != self.identity:
                return
            body = self._spec(transitions=observed.transitions, acquired=False)
            body["spec"].update(holderIdentity="", leaseDurationSeconds=1)
            body["metadata"]["resourceVersion"] = observed.version
            await asyncio.to_thread(self.api.replace_namespaced_lease, self.name, self.namespace, body)
            log.info("gave up Lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # noqa: BLE001 - it then expires on its own
            log.warning(
                "could not give up Lease %s/%s (it expires in %d s): %s",
                self.namespace,
                self.name,
                self.lease_seconds,
                exc,
            )

    async def _write(self, version: str | None, body: dict[str, Any]) -> bool:
        """Create (`version` None) or replace the Lease; whether this replica leads afterwards."""
        try:
            if version is None:
                await asyncio.to_thread(self.api.create_namespaced_lease, self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = version
                await asyncio.to_thread(self.api.replace_namespaced_lease, self.name, self.namespace, body)
        except kubernetes.client.ApiException as exc:
            if exc.status == 409:  # another replica wrote first: it leads
                if self.leading:
                    self._set(False)
                return False
            return self._failed(f"HTTP {exc.status}: {(exc.body or exc.reason or '')[:200]}")
        except Exception as exc:  # noqa: BLE001 - the API server unreachable: look again next time
            return self._failed(f"{type(exc).__name__}: {exc}")
        self._renewed_at = self.monotonic()
        if self._failing:
            log.info("Lease %s/%s written again", self.namespace, self.name)
            self._failing = False
        if not self.leading:
            log.info("leading: Lease %s/%s taken as %s", self.namespace, self.name, self.identity)
            self._set(True)
        return True

    def _failed(self, why: str) -> bool:
        # Logged once per run of failures at warning: a look is every few seconds.
        (log.debug if self._failing else log.warning)("Lease %s/%s: %s", self.namespace, self.name, why)
        self._failing = True
        if self.leading and self.monotonic() - self._renewed_at >= self.renew_deadline:
            log.warning("not renewed for %.0f s: no longer leading", self.monotonic() - self._renewed_at)
            self._set(False)
        return self.leading

    def _set(self, leading: bool) -> None:
        self.leading = leading
        for callback in self._watchers:
            callback(leading)

    def _spec(self, *, transitions: int, acquired: bool, acquire_time: Any = None) -> dict[str, Any]:
        now = self.clock()
        if acquired:
            acquire = lease_.micro_time(now)
        elif isinstance(acquire_time, datetime.datetime):
            acquire = lease_.micro_time(acquire_time)
        else:
            acquire = str(acquire_time or lease_.micro_time(now))
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": acquire,
                "renewTime": lease_.micro_time(now),
                "leaseTransitions": transitions,
            },
        }
