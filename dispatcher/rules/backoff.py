"""Exponential back-off, once: how long to wait after the n-th failure in a row.

Every waiting loop uses this rule with parameters of its own: a delivery's
retry gaps (``rules.retry.RetryPolicy``), the worker's claim and result-write
back-off after a database failure (``engine.worker``), the supervisor's worker
restarts (``runtime.supervisor``) and the mail retries of breaker notices
(``engine.notifier``).

Modelled on urllib3's ``Retry``: an immutable value and a pure function.  The
random sample is an argument (the caller draws it), so every schedule can be
replayed in a test with exact numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Backoff"]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Wait ``base`` after the first failure, ``factor`` times longer after each
    further one, never longer than ``cap``; ``jitter`` is the largest fraction
    a random draw takes off a wait.

    Jitter only shortens a wait, so the nominal schedule is the slowest case,
    and loops that failed together spread out instead of retrying in lockstep.
    """

    base: float
    factor: float = 2.0
    cap: float = math.inf
    jitter: float = 0.0

    def __post_init__(self) -> None:
        _require(math.isfinite(self.base) and self.base > 0, "base must be finite and > 0")
        _require(math.isfinite(self.factor) and self.factor >= 1, "factor must be finite and >= 1")
        _require(not math.isnan(self.cap) and self.cap > 0, "cap must be > 0 (inf: no cap)")
        # jitter == 1 would allow a zero wait, i.e. a hot loop.
        _require(0 <= self.jitter < 1, "jitter must be in [0, 1)")

    def nominal(self, attempt: int) -> float:
        """The wait after failure number ``attempt`` (1-based), before jitter."""
        _require(attempt >= 1, f"attempt numbers start at 1, got {attempt}")
        try:
            grown = self.base * float(self.factor) ** (attempt - 1)
        except OverflowError:  # far past any cap
            grown = math.inf
        return min(grown, self.cap)

    def delay(self, attempt: int, rand: float) -> float:
        """The wait after failure number ``attempt``, for a caller-drawn ``rand`` in [0, 1].

        ``rand`` 0 gives the nominal wait, 1 the shortest, ``nominal * (1 - jitter)``.
        """
        _require(0.0 <= rand <= 1.0, "rand must be in [0, 1]")
        return self.nominal(attempt) * (1.0 - self.jitter * rand)
