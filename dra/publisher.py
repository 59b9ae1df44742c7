"""Keeps this node's ResourceSlices what slices.build_slices says they should be.

The wanted slices are recomputed from the inventory and the current health every time, never
patched from a tally. A sync lists the node's slices of this driver, and when they differ from
the wanted ones (timestamps and the pool generation aside) writes all of them with the pool
generation one higher, then deletes slices that are no longer wanted, so the allocator, which
trusts only the highest generation, never mixes old and new devices.

Syncs run when `notify()` is called (health changed, or dra.slicewatch saw a slice deleted),
every `dra.sliceResyncSeconds` (repairs slices someone changed), and at most once per
`dra.sliceMinIntervalSeconds`:
notifications in between coalesce into one sync of the latest state. A failed sync is retried
with jittered exponential backoff (gpuslice.backoff, capped at a minute).

May import gpuslice.{backoff,config,contract,timeouts}, gpuslice.node.inventory and gpuslice.dra.slices.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpuslice import backoff, timeouts
from gpuslice import config as config_
from gpuslice.dra import slices
from gpuslice.node import inventory

__all__ = ["SliceApi", "SlicePublisher"]

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 60.0


class SliceApi(Protocol):
    async def node_owner(self, node_name: str) -> dict[str, str]: ...
    async def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]: ...
    async def create_slice(self, obj: dict[str, Any]) -> None: ...
    async def replace_slice(self, obj: dict[str, Any]) -> None: ...
    async def delete_slice(self, name: str) -> None: ...


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SlicePublisher:
    """Publishes one node's ResourceSlices; `run()` is its loop, `sync()` one pass."""

    def __init__(
        self,
        *,
        node: inventory.NodeInventory,
        settings: config_.Config,
        node_name: str,
        api: SliceApi,
        unhealthy: Callable[[], Mapping[str, str]] = dict,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], str] = _now,
    ) -> None:
        self.node = node
        self.contract = settings.contract
        self.driver = self.contract.dra_driver
        self.node_name = node_name
        self.api = api
        self._unhealthy = unhealthy
        self._min_interval = settings.dra.slice_min_interval_seconds
        self._resync = settings.dra.slice_resync_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self._since: dict[str, str] = {}  # unhealthy UUID -> when this plugin first saw it
        self._owner: dict[str, str] | None = None
        self._wake = asyncio.Event()
        # The first retry waits twice the rate limit, then doubling to a minute, jittered.
        self._retry = backoff.Backoff(2 * self._min_interval, MAX_BACKOFF_SECONDS, jitter=0.5)
        self.writes = 0  # slices created, replaced or deleted (tests, metrics)
        self.synced = asyncio.Event()  # set after the first successful sync

    def notify(self) -> None:
        """Something changed (health): sync soon, within the rate limit."""
        self._wake.set()

    def taints(self) -> dict[str, slices.Taint]:
        """The current taints by UUID, each dated from when it was first seen."""
        unhealthy = dict(self._unhealthy())
        for uuid in list(self._since):
            if uuid not in unhealthy:
                del self._since[uuid]
        return {
            uuid: slices.Taint(reason, self._since.setdefault(uuid, self._wall_clock()))
            for uuid, reason in unhealthy.items()
        }

    def wanted(self, generation: int) -> list[dict[str, Any]]:
        return slices.build_slices(
            self.node, self.contract, self.node_name, generation=generation, taints=self.taints(), owner=self._owner
        )

    async def sync(self) -> bool:
        """One pass; True when it wrote anything. SliceApiError (from the api) propagates."""
        if self._owner is None:
            self._owner = await self.api.node_owner(self.node_name)
        existing = await self.api.list_slices(self.node_name, self.driver)
        generation = max((int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0)
        if existing and slices.comparable(existing) == slices.comparable(self.wanted(generation)):
            return False
        wanted = self.wanted(generation + 1)
        by_name = {s["metadata"]["name"]: s for s in existing}
        for obj in wanted:
            current = by_name.pop(obj["metadata"]["name"], None)
            if current is None:
                await self.api.create_slice(obj)
            else:
                obj["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion", "")
                await self.api.replace_slice(obj)
            self.writes += 1
        for name in sorted(by_name):
            await self.api.delete_slice(name)
            self.writes += 1
        log.info(
            "published %d ResourceSlice(s) of %s, pool generation %d",
            len(wanted),
            self.node_name,
            generation + 1,
        )
        return True

    async def run(self) -> None:
        """Sync now, then on every notification (rate-limited), every resync period and after
        failures (with backoff), until cancelled."""
        last_write = -float("inf")
        while True:
            self._wake.clear()
            try:
                if await self.sync():
                    last_write = self._clock()
                self._retry.reset()
                self.synced.set()
                timeout = self._resync
            except Exception as exc:  # API errors, or a slice the API would refuse: retry later
                timeout = self._retry.next()
                log.warning("publishing ResourceSlices failed (retry in %.1fs): %s", timeout, exc)
            if not await timeouts.wait_at_most(self._wake.wait(), timeout):
                continue
            # Woken: keep at least the minimum interval after the last write, collecting changes.
            pause = last_write + self._min_interval - self._clock()
            if pause > 0:
                await asyncio.sleep(pause)
