"""Retry decisions for webhook deliveries (RFC-014); the breaker's are in ``dispatcher.rules.breaker``.

This is the pure decision layer, modelled on urllib3's ``Retry``: small
immutable values and functions that receive the clock (and the random jitter
sample) as arguments.  Nothing here reads a clock, draws a random number,
sleeps or does I/O, so every decision the engine makes can be replayed in a
test with exact numbers.

Two clocks appear and they are deliberately different:

* ``age`` is seconds since the delivery row was created, less the time it
  was held while its endpoint was paused (migration 0020), measured by the
  *database* clock, so that the 24 h ceiling means the same thing on every
  worker whatever its local clock says.
* ``now`` is unix seconds, used only to turn an HTTP-date ``Retry-After`` into
  a delay and to time the breaker (``open_until`` is stored in the database,
  so the engine should pass the database's ``now`` there too).

``python -m dispatcher.rules.retry`` prints the default retry schedule;
``docs/retry-schedule.md`` embeds that output and ``tests/unit/test_policy.py``
fails if the two differ.
"""

from __future__ import annotations

import calendar
import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_tz
from types import MappingProxyType
from typing import Literal

from dispatcher.rules.attempt import ErrorClass, TransportResult
from dispatcher.rules.backoff import Backoff
from dispatcher.rules.breaker import BreakerSignal

__all__ = [
    "DEFAULT_POLICIES",
    "DEFAULT_POLICY",
    "ERROR_TEXT_LIMIT",
    "RETRYABLE_ERRORS",
    "UNSENDABLE_ERRORS",
    "clip_error",
    "Outcome",
    "ResultLabel",
    "RetryPolicies",
    "RetryPolicy",
    "SHADOW_MARK",
    "Verdict",
    "backoff_table",
    "classify",
    "parse_retry_after",
    "schedule_markdown",
    "terminal",
]

# last_error is a bounded column shown in the console; transport details are
# meant to be short, but one runaway exception message must not bloat the row.
ERROR_TEXT_LIMIT = 256


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _require_attempt(attempt: int) -> None:
    _require(attempt >= 1, f"attempt numbers start at 1, got {attempt}")


# --------------------------------------------------------------------------
# Retry schedule
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When to try a failed delivery again, and when to give up.

    Gaps double from ``base`` up to ``max_interval`` (the back-off rule,
    ``rules.backoff``, as :attr:`backoff`); the row's last attempt is at
    ``created_at + ceiling`` at the latest, after which it is ``dead``.
    """

    base: float = 10.0
    max_interval: float = 7200.0
    ceiling: float = 86400.0
    max_attempts: int | None = None
    jitter: float = 0.2
    # Derived from base, max_interval and jitter, so left out of init, repr and equality.
    backoff: Backoff = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _require(math.isfinite(self.base) and self.base > 0, "base must be finite and > 0")
        _require(
            math.isfinite(self.max_interval) and self.max_interval > 0,
            "max_interval must be finite and > 0",
        )
        # Finite so that every row eventually ends and schedule() terminates.
        _require(math.isfinite(self.ceiling) and self.ceiling >= 0, "ceiling must be finite and >= 0")
        _require(
            self.max_attempts is None or self.max_attempts >= 1,
            "max_attempts must be None or >= 1",
        )
        # jitter == 1 would allow a zero gap, i.e. a hot retry loop.
        _require(0 <= self.jitter < 1, "jitter must be in [0, 1)")
        object.__setattr__(self, "backoff", Backoff(self.base, 2.0, self.max_interval, self.jitter))

    def nominal_gap(self, attempt: int) -> float:
        """Gap after failed attempt ``attempt`` (1-based), before jitter."""
        _require_attempt(attempt)
        return self.backoff.nominal(attempt)

    def next_delay(
        self,
        attempt: int,
        age: float,
        jitter_sample: float,
        retry_after: float | None = None,
    ) -> float | None:
        """Seconds from now until the next attempt, or ``None`` for dead.

        ``attempt`` is the number of the attempt that just failed, ``age`` the
        row's age by the database clock, ``jitter_sample`` a caller-drawn
        number in [0, 1] and ``retry_after`` an already parsed Retry-After.
        """
        _require_attempt(attempt)
        _require(math.isfinite(age), "age must be finite")
        _require(0.0 <= jitter_sample <= 1.0, "jitter_sample must be in [0, 1]")
        if self.max_attempts is not None and attempt >= self.max_attempts:
            return None
        gap = self.backoff.delay(attempt, jitter_sample)
        if retry_after is not None and retry_after > 0:
            # Honour the endpoint's request, but no further than one capped gap:
            # a buggy or hostile header must not park the row for the whole window.
            gap = max(gap, min(retry_after, self.max_interval))
        return self._fit_to_ceiling(age, gap)

    def _fit_to_ceiling(self, age: float, gap: float) -> float | None:
        if age + gap <= self.ceiling:
            return gap
        if age < self.ceiling:
            # One last attempt exactly at the ceiling rather than giving up early:
            # the window promised to customers is the full 24 h.
            return self.ceiling - age
        return None

    def schedule(self, jitter_sample: float = 0.0) -> list[float]:
        """Offsets from creation of every attempt, if every attempt fails.

        The first attempt is at 0.  With the default ``jitter_sample`` of 0 this
        is the nominal schedule; 1 gives every gap its shortest draw, which is
        the most attempts a row can get.
        """
        offsets = [0.0]
        while (delay := self.next_delay(len(offsets), offsets[-1], jitter_sample)) is not None:
            # min(): age + (ceiling - age) can round one ulp past the ceiling.
            offsets.append(min(offsets[-1] + delay, self.ceiling))
        return offsets


def _empty_policies() -> Mapping[str, RetryPolicy]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RetryPolicies:
    """The default policy plus per-event-type overrides (``retry.policies``)."""

    default: RetryPolicy = field(default_factory=RetryPolicy)
    # hash=False: a mapping is not hashable; equal objects still hash equally
    # because equality also requires equal defaults.
    by_event_type: Mapping[str, RetryPolicy] = field(default_factory=_empty_policies, hash=False)

    def __post_init__(self) -> None:
        # Copy into a read-only view: the caller's dict may change later, and one
        # RetryPolicies is shared by every worker thread.
        frozen = MappingProxyType(dict(self.by_event_type))
        for event_type, policy in frozen.items():
            _require(isinstance(policy, RetryPolicy), f"policy for {event_type!r} is not a RetryPolicy")
        object.__setattr__(self, "by_event_type", frozen)

    def for_event_type(self, event_type: str) -> RetryPolicy:
        return self.by_event_type.get(event_type, self.default)


DEFAULT_POLICY = RetryPolicy()

# docs/decisions.md, Q1: location updates are superseded every 30 s, so a stale one is
# never worth a second attempt.
DEFAULT_POLICIES = RetryPolicies(
    default=DEFAULT_POLICY,
    by_event_type={"technician.location": RetryPolicy(max_attempts=1)},
)


# --------------------------------------------------------------------------
# Retry-After
# --------------------------------------------------------------------------

# RFC 9110 delay-seconds is 1*DIGIT; ASCII only, so "1.5", "-5" and "٣" are invalid.
_DELAY_SECONDS = re.compile(r"[0-9]+")


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds the server asked us to wait, or ``None`` if it asked nothing usable.

    Accepts delay-seconds or an HTTP-date (relative to ``now``, unix seconds).
    A date in the past, garbage or an empty header is ``None``.  An absurdly
    long digit string parses as ``inf``; callers clamp (``next_delay`` does).
    """
    if value is None:
        return None
    text = value.strip()
    if _DELAY_SECONDS.fullmatch(text):
        return float(text)
    return _seconds_until_http_date(text, now)


def _seconds_until_http_date(text: str, now: float) -> float | None:
    try:
        parts = parsedate_tz(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        # Older email.utils versions raise on some malformed inputs.
        return None
    if parts is None:
        return None
    # An HTTP-date is always GMT.  A missing zone therefore means GMT, never the
    # host's local zone (mktime_tz would use it and make this function impure).
    offset = parts[9] or 0
    target = calendar.timegm(parts[:9]) - offset
    delta = target - now
    return float(delta) if delta >= 0 else None


# --------------------------------------------------------------------------
# Classifying an attempt
# --------------------------------------------------------------------------


class Verdict(enum.Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD = "dead"
    FAILED = "failed"  # terminal: the row can never be sent
    SHADOW = "shadow"  # a shadow row (rollout phase 0), done without a POST: never a delivery


# The `result` label of webhook_delivery_attempts_total and of the attempt log.
ResultLabel = Literal[
    "delivered",
    "http_3xx",
    "http_4xx",
    "http_5xx",
    "timeout",
    "connection",
    "tls",
    "dns",
    "blocked",
    "invalid_url",
    "protocol",
    "failed",
    "shadow",
]


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: Verdict
    result: ResultLabel
    delay: float | None  # seconds until the next attempt; set only for RETRY
    breaker: BreakerSignal
    error: str | None  # last_error text; None when delivered


# dispatcher.outbound.transport.ErrorClass, split by what a failure means.  Spelled out
# rather than read from the Literal so that no transport import is needed at
# run time; tests/unit/test_policy.py checks that the two agree.
RETRYABLE_ERRORS: frozenset[str] = frozenset({"timeout", "connection", "tls", "dns", "protocol"})
# Refused before anything was sent: the endpoint's configuration (URL, network
# policy) is wrong, not its health, and retrying cannot change the answer.
UNSENDABLE_ERRORS: frozenset[str] = frozenset({"blocked", "invalid_url"})
_ERROR_CLASSES = RETRYABLE_ERRORS | UNSENDABLE_ERRORS

# The statuses whose Retry-After means "come back later" (RFC 6585 §4, RFC 9110 §15.6.4);
# on a redirect it means something else, and on other errors it is not defined.
_RETRY_AFTER_STATUSES = frozenset({429, 503})

_STATUS_CLASS_LABELS: Mapping[int, ResultLabel] = MappingProxyType({3: "http_3xx", 4: "http_4xx", 5: "http_5xx"})


def classify(
    result: TransportResult,
    attempt: int,
    age: float,
    policy: RetryPolicy,
    now: float,
    jitter_sample: float,
) -> Outcome:
    """Decide what one attempt's result means for the row and the breaker.

    This is the only place that decision is made.  ``attempt`` is the number
    of the attempt that produced ``result``; ``age``, ``now`` and
    ``jitter_sample`` are as for :meth:`RetryPolicy.next_delay` and
    :func:`parse_retry_after`.  Raises ``ValueError`` if ``result`` breaks the
    transport contract.
    """
    # An error wins over a status: if the transport gave up mid-response we
    # cannot know the customer processed the event, and a duplicate is covered
    # by the idempotency key.
    if result.error is not None:
        label, text = _describe_error(result.error, result.detail)
        if result.error in UNSENDABLE_ERRORS:
            return Outcome(Verdict.FAILED, label, None, BreakerSignal.IGNORE, text)
        return _failed_attempt(label, text, policy.next_delay(attempt, age, jitter_sample))
    if result.status is None:
        raise ValueError("TransportResult has neither a status nor an error")
    if 200 <= result.status <= 299:
        return Outcome(Verdict.DELIVERED, "delivered", None, BreakerSignal.SUCCESS, None)
    retry_after = None
    if result.status in _RETRY_AFTER_STATUSES:
        retry_after = parse_retry_after(result.retry_after, now)
    label, text = _describe_status(result.status)
    return _failed_attempt(label, text, policy.next_delay(attempt, age, jitter_sample, retry_after))


def _describe_error(error: ErrorClass, detail: str) -> tuple[ResultLabel, str]:
    # The Literal type is not enforced at runtime; a transport bug must not
    # invent new metric labels.
    if error not in _ERROR_CLASSES:
        raise ValueError(f"unknown transport error class {error!r}")
    return error, clip_error(f"{error}: {detail}" if detail else error)


def _describe_status(status: int) -> tuple[ResultLabel, str]:
    label = _STATUS_CLASS_LABELS.get(status // 100) if 100 <= status <= 599 else None
    if label is not None:
        return label, f"HTTP {status}"
    # A 1xx as a *final* response, or a number outside 100-599: the peer is not
    # speaking HTTP as we understand it.
    return "protocol", f"protocol: unexpected status {status}"


def _failed_attempt(label: ResultLabel, text: str, delay: float | None) -> Outcome:
    verdict = Verdict.DEAD if delay is None else Verdict.RETRY
    return Outcome(verdict, label, delay, BreakerSignal.FAILURE, text)


def clip_error(text: str) -> str:
    """An error text as stored and shown: at most ERROR_TEXT_LIMIT characters."""
    return text if len(text) <= ERROR_TEXT_LIMIT else text[: ERROR_TEXT_LIMIT - 1] + "…"


# Why a row ends without a request: written by the engine (terminal) and by
# the API/CLI when an endpoint is deactivated or deleted (store.endpoints).
ENDPOINT_DELETED = "endpoint deleted"
ENDPOINT_DEACTIVATED = "endpoint deactivated"
# Why the upkeep sweep ends a row at its ceiling without an attempt of its own
# (breaker.last_chance_spent): appended to the row's last error.
LAST_CHANCE_SPENT = "retry window ended; the endpoint failed again after it (breaker open)"
# Why the upkeep ends a held row of a paused endpoint (endpoints.hold_for, migration 0020).
HELD_EXPIRED = "held longer than endpoints.hold_for while the endpoint was paused"


def terminal(reason: str) -> Outcome:
    """The outcome for a row that can never be sent (endpoint gone, event missing).

    No attempt was made, so the breaker learns nothing.
    """
    return Outcome(Verdict.FAILED, "failed", None, BreakerSignal.IGNORE, clip_error(reason))


# A shadow row's end (rollout phase 0): marked done without a POST, so never a
# delivery: a status and a result of its own, and nothing for the breaker.
SHADOW_MARK = Outcome(Verdict.SHADOW, "shadow", None, BreakerSignal.IGNORE, None)


# --------------------------------------------------------------------------
# Documentation
# --------------------------------------------------------------------------


def _human(seconds: float) -> str:
    """``4170`` -> ``"1 h 9 min 30 s"``; non-integers fall back to seconds."""
    if seconds != int(seconds):
        return f"{seconds:g} s"
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((hours, "h"), (minutes, "min"), (secs, "s")) if n]
    return " ".join(parts) or "0 s"


def _fmt(seconds: float) -> str:
    return f"{seconds:g}" if seconds != int(seconds) else str(int(seconds))


def backoff_table(policy: RetryPolicy) -> str:
    """Markdown table of the nominal schedule of ``policy`` when every attempt fails."""
    offsets = policy.schedule()
    rows = [
        "| Attempt | Offset from creation (s) | Offset | Gap before it |",
        "|--------:|-------------------------:|-------:|--------------:|",
        "| 1 | 0 | 0 s | — |",
    ]
    for n in range(2, len(offsets) + 1):
        gap = offsets[n - 1] - offsets[n - 2]
        clamped = " (ceiling)" if gap < policy.nominal_gap(n - 1) else ""
        rows.append(f"| {n} | {_fmt(offsets[n - 1])} | {_human(offsets[n - 1])} | {_human(gap)}{clamped} |")
    return "\n".join(rows)


def _summary(policy: RetryPolicy) -> str:
    nominal, most = len(policy.schedule()), len(policy.schedule(jitter_sample=1.0))
    return (
        f"{nominal} attempts (nominal, no jitter), the last at {_human(policy.schedule()[-1])} "
        f"after creation; then the row is `dead`. Because jitter only shortens gaps, "
        f"a row can get up to {most} attempts when every gap draws its shortest value."
    )


def _describe(policy: RetryPolicy) -> str:
    limit = "none" if policy.max_attempts is None else str(policy.max_attempts)
    return (
        f"base {_human(policy.base)}, doubling, gap cap {_human(policy.max_interval)}, "
        f"ceiling {_human(policy.ceiling)}, jitter {policy.jitter:g}, max_attempts {limit}"
    )


def schedule_markdown(policies: RetryPolicies = DEFAULT_POLICIES) -> str:
    """The generated block of docs/retry-schedule.md."""
    default = policies.default
    lines = [f"Default policy: {_describe(default)}.", "", backoff_table(default), "", _summary(default)]
    for event_type, policy in sorted(policies.by_event_type.items()):
        count = len(policy.schedule())
        lines += ["", f"Override `{event_type}`: {_describe(policy)}; {count} attempt(s) in all."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(schedule_markdown())
