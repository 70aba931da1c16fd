"""The circuit breaker (RFC-014 "Circuit breaker endpoint_state"): the rule, in one place.

Pure values and decisions, like ``dispatcher.rules.retry``'s retry schedule: they
take the clock as an argument and do no I/O.  Everything else that must agree
with the rule is derived from it or tested against it on one table of cases
(``tests/integration/test_breaker_rule.py``):

* the claim (``engine_claim`` in ``sql/engine.sql``) sends to ``closed``
  endpoints, lets exactly one probe through once an ``open`` window or a
  ``half_open`` probe lease has lapsed, and skips the rest -- :meth:`BreakerPolicy.admits`;
* the API and console show :meth:`BreakerPolicy.shown_state`, and which pending rows
  wait for the breaker, :meth:`BreakerPolicy.holds`;
* a flush of finished attempts updates the stored breakers through
  :class:`BreakerBatch`, whose fast path (no read, no lock) is exact only for
  rows that are still ``closed`` -- the guard of ``engine_breaker_touch``;
* the upkeep leader's sweep (``engine_sweep_expired``) ends a row at its retry
  ceiling only where :func:`last_chance_spent` says so
  (``tests/integration/test_last_chance_rule.py``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, get_args


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


class BreakerSignal(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    IGNORE = "ignore"  # says nothing about the endpoint's health


# Plain strings (not an Enum) because they are stored in endpoint_state.state
# as-is; DB drivers adapt str without surprises.
BreakerState = Literal["closed", "open", "half_open"]
_BREAKER_STATES: frozenset[str] = frozenset(get_args(BreakerState))

Admission = Literal["send", "probe", "skip"]
Transition = Literal["opened", "reopened", "closed", "half_opened"]


@dataclass(frozen=True, slots=True)
class EndpointBreaker:
    """A snapshot of one endpoint_state row.

    ``open_until`` (unix seconds, database clock) ends the cool-off window when
    ``open``, and the in-flight probe's lease when ``half_open``.
    """

    state: str = "closed"
    consecutive_failures: int = 0
    open_until: float | None = None

    def __post_init__(self) -> None:
        _require(self.state in _BREAKER_STATES, f"unknown breaker state {self.state!r}")
        _require(self.consecutive_failures >= 0, "consecutive_failures must be >= 0")

    def lapsed(self, now: float) -> bool:
        # A missing deadline counts as lapsed: an open breaker that can never
        # be probed would wedge its endpoint forever.
        return self.open_until is None or now >= self.open_until


CLOSED = EndpointBreaker()


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failure_threshold: int = 20
    open_for: float = 300.0

    def __post_init__(self) -> None:
        _require(self.failure_threshold >= 1, "failure_threshold must be >= 1")
        _require(math.isfinite(self.open_for) and self.open_for > 0, "open_for must be finite and > 0")

    def admits(self, b: EndpointBreaker, now: float) -> Admission:
        """May a due delivery to this endpoint be sent now?

        ``skip`` consumes no attempt.  Both the cool-off window (``open``) and a
        probe's lease (``half_open``) end at ``open_until``; after that the
        next delivery probes, so a crashed prober cannot wedge the endpoint.
        """
        if b.state == "closed":
            return "send"
        return "probe" if b.lapsed(now) else "skip"

    def shown_state(self, b: EndpointBreaker, now: float) -> BreakerState:
        """The state customers see (API, console): derived from :meth:`admits`, so
        an open breaker whose window has lapsed shows ``half_open`` -- the next
        due delivery is its probe -- whatever the stored row still says."""
        admission = self.admits(b, now)
        if admission == "send":
            return "closed"
        return "half_open" if admission == "probe" else b.state  # type: ignore[return-value]

    def holds(self, b: EndpointBreaker, due_at: float, now: float) -> bool:
        """Does the breaker, rather than its own schedule, keep a pending row due at ``due_at`` waiting?

        Yes while the claim skips the endpoint (:meth:`admits`) and the row falls due
        before the skip ends at ``open_until`` (the open window, or a half-open probe's
        lease): until then its past or near ``next_attempt_at`` is not when it goes.  A
        row due after that keeps its own time; behind a lapsed window the next due row
        is the probe, so nothing is held.  The API shows this (a delivery's ``breaker_hold``).
        """
        return self.admits(b, now) == "skip" and b.open_until is not None and due_at < b.open_until

    def after(self, b: EndpointBreaker, signals: Sequence[BreakerSignal], now: float) -> EndpointBreaker:
        """The breaker after applying attempt signals in order."""
        for signal in signals:
            b = self._apply(b, signal, now)
        return b

    def _apply(self, b: EndpointBreaker, signal: BreakerSignal, now: float) -> EndpointBreaker:
        if signal is BreakerSignal.SUCCESS:
            return CLOSED
        if signal is BreakerSignal.IGNORE:
            return b
        failures = b.consecutive_failures + 1
        if self._opens(b, failures, now):
            return EndpointBreaker("open", failures, now + self.open_for)
        return replace(b, consecutive_failures=failures)

    def _opens(self, b: EndpointBreaker, failures: int, now: float) -> bool:
        if b.state == "closed":
            return failures >= self.failure_threshold
        if b.state == "half_open":
            return True  # the probe failed: another full window
        # open: failures of requests sent before it opened must not extend the
        # window (open_for >> request timeout, so they arrive inside it).  A
        # failure after the window lapsed is a probe's answer: without a new
        # window the endpoint would be probed on every poll.
        return b.lapsed(now)

    @staticmethod
    def transitions(old: EndpointBreaker, new: EndpointBreaker) -> Transition | None:
        """A label for the change from ``old`` to ``new``, for logs and metrics."""
        if new.state == "open":
            if old.state == "closed":
                return "opened"  # docs/decisions.md, Q3: notify the endpoint owner here
            if old.state == "half_open" or old.open_until != new.open_until:
                return "reopened"
            return None
        if new.state == old.state:
            return None
        return "closed" if new.state == "closed" else "half_opened"


def last_chance_spent(b: EndpointBreaker, opened_at: float | None, ceiling_at: float) -> bool:
    """May a pending row whose retry window ended at ``ceiling_at`` end ``dead``
    without an attempt of its own (docs/decisions.md, "Last chance")?

    Only when its endpoint failed an attempt the breaker admitted after that
    moment: the breaker is ``open`` and its window opened -- on the failure that
    reached the threshold, or on a failed probe -- at ``opened_at >= ceiling_at``
    (unix seconds, database clock).  Every other row waits for an attempt that
    decides it: behind a closed breaker the claim sends it, behind a half-open
    one the probe in flight answers, and behind a window that opened before its
    ceiling the next probe comes at most ``open_for`` later.  If that probe
    fails, the window it opens makes this true, so no row waits forever.
    """
    return b.state == "open" and opened_at is not None and opened_at >= ceiling_at


@dataclass(frozen=True, slots=True)
class BreakerWrite:
    """One endpoint's breaker change, ready for the store to write."""

    endpoint_id: int
    previous: EndpointBreaker
    breaker: EndpointBreaker
    succeeded: bool
    failed: bool
    error: str | None

    @property
    def opens_window(self) -> bool:
        """Whether a new open window starts here: the store records when (``opened_at``),
        which :func:`last_chance_spent` reads."""
        return BreakerPolicy.transitions(self.previous, self.breaker) in ("opened", "reopened")


@dataclass(frozen=True, slots=True)
class Signal:
    """What one finished attempt tells the breaker of its endpoint."""

    endpoint_id: int
    signal: BreakerSignal
    error: str | None


class BreakerBatch:
    """The breaker decisions of one flush of finished attempts, per endpoint."""

    def __init__(self, policy: BreakerPolicy, signals: Iterable[Signal]) -> None:
        self._policy = policy
        self._by_endpoint: dict[int, list[Signal]] = {}
        for signal in signals:
            if signal.signal is not BreakerSignal.IGNORE:
                self._by_endpoint.setdefault(signal.endpoint_id, []).append(signal)

    @property
    def endpoint_ids(self) -> list[int]:
        return list(self._by_endpoint)

    def decide(self, endpoint_id: int, old: EndpointBreaker, now: float) -> BreakerWrite:
        """The write for ``endpoint_id`` given its stored breaker ``old`` at ``now``."""
        signals = self._by_endpoint[endpoint_id]
        new = self._policy.after(old, [s.signal for s in signals], now)
        failed = [s for s in signals if s.signal is BreakerSignal.FAILURE]
        return BreakerWrite(endpoint_id, old, new, len(failed) < len(signals), bool(failed),
                            failed[-1].error if failed else None)

    def closed_writes(self) -> list[BreakerWrite]:
        """The writes of endpoints whose batch holds a success and leaves them closed.

        A success closes the breaker whatever its state, so for such a batch the
        answer does not depend on the stored state, nor on the clock while it
        stays closed: it is computed here without reading the row.  It is exact
        only where the stored row is ``closed`` (no transition to announce), so
        the store writes it only there and returns the endpoints it wrote; every
        other endpoint takes the lock / :meth:`decide` / write path.
        """
        writes = []
        for endpoint_id, signals in self._by_endpoint.items():
            if any(s.signal is BreakerSignal.SUCCESS for s in signals):
                write = self.decide(endpoint_id, CLOSED, 0.0)
                if write.breaker.state == "closed":
                    writes.append(write)
        return writes
