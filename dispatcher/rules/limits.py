"""The per-endpoint limits, held region-wide (docs/decisions.md, Region-wide concurrency: "the RFC's 4 is what
the customer's endpoint sees in total, across every process and host").

Two limits decide how many rows of one endpoint a claim may take:

* **concurrency**: at most ``concurrency`` rows leased and unfinished at once
  (status pending, a claim token, lease not lapsed), whoever holds them;
* **rate** (optional, ``webhook_endpoints.max_per_second``): a token bucket of
  ``max(1, rate)`` tokens refilled at ``rate`` per second; every row claimed
  takes one.  A missing bucket is full.

A slot is taken from the claim until the attempt's result is written, and an
attempt that timed out keeps it a while longer (:func:`slot_hold`).

The claim applies this rule in SQL (``dispatcher_room`` and
``dispatcher_bucket_after``, migration 0006, called by ``dispatcher_lane_free``, 0013) under a per-endpoint transaction
lock, so concurrent claimers never both see the same free slots.  The functions
here are the rule itself, pure, with the elapsed time as an argument; the slots
taken (``in_flight``) are the live leases plus the timed-out slots still in
their hold, and a lapsed lease takes none.  The claim is one SQL statement, so
no Python path evaluates :class:`EndpointLimits`: ``tests/integration/test_limits_rule.py``
holds it, the SQL functions and the claim to one table of cases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EndpointLimits:
    concurrency: int
    max_per_second: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.max_per_second is not None and not (0 < self.max_per_second < math.inf):
            raise ValueError("max_per_second must be a positive number")

    @property
    def burst(self) -> float | None:
        """Tokens a full bucket holds: one second's worth, and at least one row."""
        return None if self.max_per_second is None else max(1.0, self.max_per_second)

    def tokens(self, stored: float | None, elapsed: float) -> float | None:
        """The bucket's level ``elapsed`` seconds after it held ``stored`` (None: no bucket yet)."""
        if self.max_per_second is None or self.burst is None:
            return None
        if stored is None:
            return self.burst
        return min(self.burst, stored + self.max_per_second * max(elapsed, 0.0))

    def room(self, in_flight: int, stored: float | None, elapsed: float) -> int:
        """How many rows a claim may take now."""
        free = max(0, self.concurrency - in_flight)
        level = self.tokens(stored, elapsed)
        if level is None:
            return free
        return max(0, min(free, math.floor(level)))

    def after(self, stored: float | None, elapsed: float, taken: int) -> float | None:
        """The bucket's level once a claim took ``taken`` rows (never below zero)."""
        level = self.tokens(stored, elapsed)
        return None if level is None else max(0.0, level - taken)


def slot_hold(result: str, deadline: float) -> float:
    """Seconds an attempt's lane slot stays taken after its result is written.

    A timed-out attempt's (``result`` ``timeout``) stays taken for one more
    ``deadline`` (``http.timeout``): we stopped waiting, but the endpoint may
    still be working on it, and sending it the next row at once would put more
    requests on it than its limit.  A receiver still busy past twice the
    deadline is taken for hung.  Held for as long as a lease instead, a busy
    endpoint with occasional timeouts would lose most of its lane.  Every
    other result hands the slot back at once: the exchange is over.
    """
    return deadline if result == "timeout" else 0.0
