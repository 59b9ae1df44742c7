"""Waiting with a time limit, without losing a cancellation.

`asyncio.wait_for` on Python 3.11 returns normally when the task awaiting it is cancelled in the
very moment the awaited thing completes (an Event set by a notification, say): the cancellation
is lost, and a loop that waits that way runs on after its owner cancelled it and waits for it
forever (python/cpython#86296, fixed in 3.12 by rebuilding `wait_for` on `asyncio.timeout`).
Every wait with a limit in gpuslice goes through `asyncio.timeout`, here or directly.

May import only the standard library.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

__all__ = ["wait_at_most"]


async def wait_at_most(awaitable: Awaitable[object], seconds: float) -> bool:
    """Await `awaitable` for at most `seconds` (cancelled when they pass): True when it finished,
    False when the time ran out. A cancellation of the caller always propagates."""
    try:
        async with asyncio.timeout(max(0.0, seconds)):
            await awaitable
    except TimeoutError:
        return False
    return True
