"""The pacer's heartbeat: a coordination.k8s.io/v1 Lease it renews while it can release pods.

The webhook gates pods only while this Lease is renewed (webhook/pacerlease.py), so a pacer that
is down does not leave every new pod waiting. `run()` creates the Lease when it is missing and
otherwise replaces it with a new `renewTime` every third of `pacing.leaseSeconds`, with the
version last read or written (a conflict reads it again). Errors are logged and retried at the
next beat, never fatal: the webhook then stops gating, which is what a pacer that cannot reach the
API server should cause. On shutdown the Lease is left to expire.

May import gpuslice.config and the kubernetes client.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import Any, Protocol

import kubernetes

__all__ = ["Heartbeat", "LeaseApi", "micro_time"]

log = logging.getLogger(__name__)


class LeaseApi(Protocol):
    """The calls of kubernetes.client.CoordinationV1Api the heartbeat makes (tests pass a fake)."""

    def read_namespaced_lease(self, name: str, namespace: str) -> Any: ...

    def create_namespaced_lease(self, namespace: str, body: Any) -> Any: ...

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any) -> Any: ...


def micro_time(moment: datetime.datetime) -> str:
    """A MicroTime as the API server parses it: always six fraction digits (Python's isoformat
    leaves them out at a whole second, which the API server refuses)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Heartbeat:
    """Renews Lease `namespace`/`name` as `identity` until cancelled (`beat()` is one renewal)."""

    def __init__(
        self,
        api: LeaseApi,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_seconds: int,
        clock: Callable[[], datetime.datetime] = _now,
    ) -> None:
        self.api = api
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.renewals = 0  # renewals the API server accepted (creation included)
        self._version = ""  # resourceVersion of the Lease as last read or written; "" reads first
        self._failing = False  # a failure was logged; the next success is logged too

    @property
    def interval(self) -> float:
        return self.lease_seconds / 3

    async def run(self) -> None:
        log.info("renewing Lease %s/%s every %.1f s as %s", self.namespace, self.name, self.interval, self.identity)
        while True:
            await self.beat()
            await asyncio.sleep(self.interval)

    async def beat(self) -> bool:
        """One renewal (the Lease created if missing); whether the API server took it."""
        try:
            if not self._version:
                await self._read_or_create()
            else:
                written = await asyncio.to_thread(
                    self.api.replace_namespaced_lease, self.name, self.namespace, self._body(self._version)
                )
                self._version = _version_of(written)
        except kubernetes.client.ApiException as exc:
            self._version = ""  # a conflict (someone else wrote it) or gone: read it again next time
            self._failed(f"HTTP {exc.status}: {(exc.body or exc.reason or '')[:200]}")
            return False
        except Exception as exc:  # noqa: BLE001 - the API server unreachable: try again next beat
            self._version = ""
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        self.renewals += 1
        if self._failing:
            log.info("Lease %s/%s renewed again", self.namespace, self.name)
            self._failing = False
        return True

    async def _read_or_create(self) -> None:
        try:
            current = await asyncio.to_thread(self.api.read_namespaced_lease, self.name, self.namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            created = await asyncio.to_thread(self.api.create_namespaced_lease, self.namespace, self._body(""))
            self._version = _version_of(created)
            log.info("created Lease %s/%s", self.namespace, self.name)
            return
        written = await asyncio.to_thread(
            self.api.replace_namespaced_lease, self.name, self.namespace, self._body(_version_of(current))
        )
        self._version = _version_of(written)

    def _body(self, version: str) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if version:
            metadata["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "renewTime": micro_time(self.clock()),
            },
        }

    def _failed(self, why: str) -> None:
        # Logged every time at debug, once per run of failures at warning: a beat is every few seconds.
        (log.debug if self._failing else log.warning)(
            "could not renew Lease %s/%s (the webhook stops gating once it expires): %s",
            self.namespace,
            self.name,
            why,
        )
        self._failing = True


def _version_of(lease: Any) -> str:
    """resourceVersion of a Lease as the client returns it (a V1Lease)."""
    return str(getattr(getattr(lease, "metadata", None), "resource_version", "") or "")
