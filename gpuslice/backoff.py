"""Retry delays: one exponential backoff, capped and optionally jittered, shared by every loop that
retries the API server or kubelet (the node labeller, the DRA slice publisher, the list+watch loop,
the webhook's requeuer).

Only the delays live here; each caller keeps its own loop, because those loops also rate-limit,
wake on notifications and stop on request, which a retry decorator (backoff, tenacity) would have
to be bent around. May import only the standard library.
"""

from __future__ import annotations

import math
import random

__all__ = ["Backoff"]


class Backoff:
    """`initial * factor**n` seconds after the n-th failure since the last `reset` (n from 0), at
    most `maximum`, then scaled by a random factor in [1 - jitter, 1]: replicas or nodes that failed
    together retry apart instead of in step. jitter 0 gives the plain doubling."""

    def __init__(
        self,
        initial: float,
        maximum: float = math.inf,
        *,
        factor: float = 2.0,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if initial < 0 or maximum < 0:
            raise ValueError(f"backoff delays must not be negative, got initial {initial}, maximum {maximum}")
        if factor < 1:
            raise ValueError(f"backoff factor must be at least 1, got {factor}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"backoff jitter must be 0..1, got {jitter}")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._rng = rng if rng is not None else random.Random()
        self.failures = 0  # since the last reset

    def delay(self, attempt: int) -> float:
        """The delay after failure number `attempt` (0 = the first), without counting it: for callers
        whose count lives elsewhere (the requeuer keeps it on the pod)."""
        try:
            raw = self.initial * self.factor ** max(0, attempt)
        except OverflowError:  # factor**attempt beyond a float: the cap applies (0 stays 0)
            raw = math.inf if self.initial else 0.0
        capped = min(self.maximum, raw)
        if self.jitter:
            capped *= self._rng.uniform(1 - self.jitter, 1)
        return capped

    def next(self) -> float:
        """Count a failure and return how long to wait before the next try."""
        seconds = self.delay(self.failures)
        self.failures += 1
        return seconds

    def reset(self) -> None:
        """A try worked: the next failure waits `initial` again."""
        self.failures = 0
