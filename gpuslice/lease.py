"""The coordination.k8s.io/v1 Lease protocol both sides speak: the controller's leader election
(controller/leader.py) writes it, the webhook (webhook/pacerlease.py) reads it.

Pure: what a read says (`Observed`), when a holder's renewal lapses (`Renewals`), and the time
format the API server accepts (`micro_time`). A renewal counts from when a read first shows it,
by the reader's own monotonic clock, so the writer's and the reader's clocks need not agree;
only a reader with nothing to compare yet may judge a renewal's age by its wall clock
(`age_of`). The Lease is held until `leaseDurationSeconds` after that; a Lease with no holder
was given up and is held by nobody.

Imports only the standard library: the callers make the API calls.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

__all__ = ["Observed", "Renewals", "age_of", "duration_of", "micro_time", "observe"]


def micro_time(moment: datetime.datetime) -> str:
    """A MicroTime as the API server parses it: always six fraction digits (Python's isoformat
    leaves them out at a whole second, which the API server refuses)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class Observed:
    """What one read of a Lease (a V1Lease as the client returns it) says."""

    holder: str  # "" when nobody holds it (never taken, or given up)
    renew_time: Any  # a datetime as the client decodes it; None when never renewed
    duration: int | None  # leaseDurationSeconds, when the Lease says a usable one
    transitions: int
    acquire_time: Any
    version: str  # metadata.resourceVersion, for a write that must not overwrite another's

    @property
    def renewal(self) -> tuple[str, str]:
        """What identifies one renewal: a new renewTime or a new holder is a new renewal."""
        return (self.holder, str(self.renew_time or ""))


def observe(lease: Any) -> Observed:
    spec = getattr(lease, "spec", None)
    duration = getattr(spec, "lease_duration_seconds", None)
    return Observed(
        holder=str(getattr(spec, "holder_identity", "") or ""),
        renew_time=getattr(spec, "renew_time", None),
        duration=duration if isinstance(duration, int) and duration > 0 else None,
        transitions=int(getattr(spec, "lease_transitions", 0) or 0),
        acquire_time=getattr(spec, "acquire_time", None),
        version=str(getattr(getattr(lease, "metadata", None), "resource_version", "") or ""),
    )


def duration_of(observed: Observed | None, default: int) -> int:
    """How long a renewal holds: the Lease's own word, else the reader's configured duration."""
    return observed.duration if observed is not None and observed.duration is not None else default


def age_of(renew_time: Any, now: datetime.datetime) -> float:
    """Seconds since `renew_time` by the wall clock `now` (never negative; a renewal time without
    a zone is UTC, as the API server writes it); 0 when it is not a time."""
    if not isinstance(renew_time, datetime.datetime):
        return 0.0
    if renew_time.tzinfo is None:
        renew_time = renew_time.replace(tzinfo=datetime.UTC)
    return max(0.0, (now - renew_time).total_seconds())


class Renewals:
    """The last renewal a reader saw, and when (by its monotonic clock) it first saw it."""

    def __init__(self) -> None:
        self.seen: tuple[str, str] | None = None
        self.seen_at = float("-inf")
        self._age = 0.0  # how old the renewal already was when first seen (the first read only)

    def saw(self, renewal: tuple[str, str], now: float, *, age: float = 0.0) -> bool:
        """Record a read showing `renewal` at monotonic `now`; whether it is a new one. `age`: how
        old it already was, for a reader that has seen none before."""
        if renewal == self.seen:
            return False
        self.seen, self.seen_at, self._age = renewal, now, max(0.0, age)
        return True

    def forget(self) -> None:
        """Nobody holds the Lease (missing, or given up)."""
        self.seen, self.seen_at, self._age = None, float("-inf"), 0.0

    def held(self, now: float, duration: float) -> bool:
        """Whether the last renewal seen still holds at monotonic `now`, for `duration` seconds."""
        return self.seen is not None and now - self.seen_at + self._age < duration
