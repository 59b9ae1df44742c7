"""How a replay's pods arrive at the API server (`--arrival`): one at a time, all at once, or at
the trace's own gaps compressed; each create sent again on a connection error, and every answer
recorded in the run's outcomes (sim/kube_outcomes.py).

May import aiohttp (through sim.kube_api), gpuslice.timeouts and the other gpuslice.sim modules.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

from gpuslice import timeouts
from gpuslice.sim import kube_api, kube_outcomes, trace

CREATE_CONCURRENCY = 32  # pod creates in flight in burst and compressed modes


POD_TIMEOUT = 120.0  # sequential: longest wait for one pod's outcome


# Sends of one create whose webhook call failed (its replica died with it in flight), as a client retries.
CREATE_ATTEMPTS = 5


@dataclasses.dataclass(frozen=True)
class Arrival:
    mode: str  # sequential, burst, compressed
    factor: float = 1.0  # compressed: trace seconds per replay second

    def __str__(self) -> str:
        return f"compressed:{self.factor:g}" if self.mode == "compressed" else self.mode


def parse_arrival(text: str) -> Arrival:
    """`sequential`, `burst` or `compressed:<factor>` (factor > 0)."""
    if text in ("sequential", "burst"):
        return Arrival(text)
    if text.startswith("compressed:"):
        raw = text.split(":", 1)[1]
        try:
            factor = float(raw)
        except ValueError:
            factor = 0.0
        if factor > 0:
            return Arrival("compressed", factor)
        raise ValueError(f"--arrival compressed:<factor> needs a factor greater than 0, got {raw!r}")
    raise ValueError(f"--arrival must be sequential, burst or compressed:<factor>, got {text!r}")


def trace_gaps(pods_file: str | os.PathLike[str]) -> list[float]:
    """Seconds between consecutive pod creations of the trace (its creation_time column, sorted)."""
    with open(pods_file, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or "creation_time" not in rows[0]:
        raise trace.TraceError(f"{pods_file}: no creation_time column, needed by --arrival compressed")
    try:
        times = sorted(float(r["creation_time"] or 0) for r in rows)
    except ValueError as exc:
        raise trace.TraceError(f"{pods_file}: creation_time: {exc}") from None
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return gaps or [0.0]


async def _create(api: kube_api.Api, manifest: dict[str, Any], outcomes: kube_outcomes.Outcomes) -> None:
    key = f"{kube_outcomes.NAMESPACE}/{manifest['metadata']['name']}"
    try:
        created = await _send(api, manifest, outcomes)
        outcomes.created_at[key] = time.monotonic()
        version = str((created.get("metadata") or {}).get("resourceVersion") or "")
        if version.isdigit():
            outcomes.stored[key] = int(version)
    except kube_api.ApiError as exc:
        outcomes.created_at[key] = time.monotonic()
        if "denied the request" not in exc.message:  # not the webhook's answer: named in the errors
            outcomes.errors.append(f"create {key}: {exc}")
        outcomes.deny(key, exc.message)
        return
    outcomes.created.add(key)


async def _send(api: kube_api.Api, manifest: dict[str, Any], outcomes: kube_outcomes.Outcomes) -> Any:
    """The create, sent again (as a controller would) while it fails because the API server could not
    call the webhook: the replica that had it died (--chaos), and failurePolicy Fail refused it."""
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return await api.create(f"/api/v1/namespaces/{kube_outcomes.NAMESPACE}/pods", manifest)
        except kube_api.ApiError as exc:
            if "failed calling webhook" not in exc.message or attempt == CREATE_ATTEMPTS - 1:
                raise
            outcomes.create_retries += 1
            await asyncio.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")


async def arrive(
    api: kube_api.Api,
    manifests: Sequence[dict[str, Any]],
    outcomes: kube_outcomes.Outcomes,
    arrival: Arrival,
    gaps: Sequence[float],
) -> None:
    if arrival.mode == "sequential":
        for manifest in manifests:
            key = f"{kube_outcomes.NAMESPACE}/{manifest['metadata']['name']}"
            waiter = outcomes.waiter(key)
            await _create(api, manifest, outcomes)
            if not await timeouts.wait_at_most(waiter, POD_TIMEOUT):
                outcomes.errors.append(f"{key}: no outcome after {POD_TIMEOUT:.0f} s")
        return
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(manifest: dict[str, Any], at: float) -> None:
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            await _create(api, manifest, outcomes)

    offsets = [0.0] * len(manifests)
    if arrival.mode == "compressed":
        elapsed = 0.0
        for i in range(len(manifests)):
            offsets[i] = elapsed / arrival.factor
            elapsed += gaps[i % len(gaps)]
    await asyncio.gather(*(one(m, at) for m, at in zip(manifests, offsets, strict=True)))
