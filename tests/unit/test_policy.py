"""Unit and property tests for dispatcher.rules.retry, the pure retry/breaker decisions.

No database, no network, no clock: every input is passed explicitly.
"""

from __future__ import annotations

import calendar
import dataclasses
import math
import subprocess
import sys
from email.utils import formatdate
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dispatcher.rules import retry as policy_module
from dispatcher.rules.attempt import ErrorClass, TransportResult
from dispatcher.rules.breaker import CLOSED, BreakerPolicy, BreakerSignal, EndpointBreaker
from dispatcher.rules.retry import (
    DEFAULT_POLICIES,
    DEFAULT_POLICY,
    ERROR_TEXT_LIMIT,
    Outcome,
    ResultLabel,
    RetryPolicies,
    RetryPolicy,
    Verdict,
    backoff_table,
    classify,
    parse_retry_after,
    schedule_markdown,
    terminal,
)

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "retry-schedule.md"

NOW = float(calendar.timegm((2026, 9, 22, 12, 0, 0)))  # Tue, 22 Sep 2026 12:00:00 GMT
OK, FAIL, IGN = BreakerSignal.SUCCESS, BreakerSignal.FAILURE, BreakerSignal.IGNORE
RETRYABLE_ERRORS = ["timeout", "connection", "tls", "dns", "protocol"]
UNSENDABLE_ERRORS = ["blocked", "invalid_url"]

# The default schedule, written out by hand so that a change to the maths shows up here.
DEFAULT_OFFSETS = [
    0, 10, 30, 70, 150, 310, 630, 1270, 2550, 5110, 10230,
    17430, 24630, 31830, 39030, 46230, 53430, 60630, 67830, 75030, 82230,
    86400,
]  # fmt: skip


def response(
    status: int | None = None, *, error: Any = None, detail: str = "", retry_after: str | None = None
) -> TransportResult:
    return TransportResult(status=status, body=b"", error=error, detail=detail, retry_after=retry_after, duration=0.1)


def outcome_of(
    result: TransportResult,
    attempt: int = 1,
    age: float = 0.0,
    policy: RetryPolicy = DEFAULT_POLICY,
    sample: float = 0.0,
) -> Outcome:
    return classify(result, attempt=attempt, age=age, policy=policy, now=NOW, jitter_sample=sample)


# ---------------------------------------------------------------- RetryPolicy


class TestRetryPolicyValues:
    def test_defaults_match_decisions(self) -> None:
        p = RetryPolicy()
        assert (p.base, p.max_interval, p.ceiling, p.max_attempts, p.jitter) == (10.0, 7200.0, 86400.0, None, 0.2)

    def test_frozen(self) -> None:
        with pytest.raises(dataclasses.FrozenInstanceError):
            DEFAULT_POLICY.base = 1.0  # type: ignore[misc]

    def test_hashable_and_equal_by_value(self) -> None:
        assert RetryPolicy() == RetryPolicy()
        assert hash(RetryPolicy()) == hash(RetryPolicy())
        assert RetryPolicy(max_attempts=1) != RetryPolicy()

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"base": 0}, {"base": -1}, {"base": math.inf}, {"base": math.nan},
            {"max_interval": 0}, {"max_interval": math.inf},
            {"ceiling": -1}, {"ceiling": math.inf}, {"ceiling": math.nan},
            {"max_attempts": 0}, {"max_attempts": -3},
            {"jitter": -0.1}, {"jitter": 1.0}, {"jitter": math.nan},
        ],
    )  # fmt: skip
    def test_rejects_invalid(self, kwargs: dict[str, Any]) -> None:
        with pytest.raises(ValueError):
            RetryPolicy(**kwargs)

    def test_accepts_edge_values(self) -> None:
        RetryPolicy(ceiling=0, jitter=0, max_attempts=1)
        RetryPolicy(jitter=0.999)


class TestNominalGap:
    @pytest.mark.parametrize(
        ("attempt", "gap"),
        [(1, 10), (2, 20), (3, 40), (9, 2560), (10, 5120), (11, 7200), (12, 7200), (50, 7200)],
    )
    def test_doubles_then_caps(self, attempt: int, gap: float) -> None:
        assert DEFAULT_POLICY.nominal_gap(attempt) == gap

    def test_huge_attempt_numbers_do_not_overflow(self) -> None:
        assert DEFAULT_POLICY.nominal_gap(10**6) == 7200
        assert RetryPolicy(base=1e300, max_interval=1e301).nominal_gap(2000) == 1e301

    @pytest.mark.parametrize("attempt", [0, -1])
    def test_attempts_are_one_based(self, attempt: int) -> None:
        with pytest.raises(ValueError):
            DEFAULT_POLICY.nominal_gap(attempt)


class TestNextDelay:
    def test_no_jitter_sample_gives_nominal_gap(self) -> None:
        assert DEFAULT_POLICY.next_delay(1, age=0.0, jitter_sample=0.0) == 10.0
        assert DEFAULT_POLICY.next_delay(4, age=70.0, jitter_sample=0.0) == 80.0

    def test_jitter_lower_bound_at_sample_one(self) -> None:
        assert DEFAULT_POLICY.next_delay(1, age=0.0, jitter_sample=1.0) == pytest.approx(8.0)

    def test_jitter_just_below_one_stays_inside_the_range(self) -> None:
        delay = DEFAULT_POLICY.next_delay(1, age=0.0, jitter_sample=0.999999)
        assert delay is not None
        assert 8.0 < delay < 8.0001

    def test_jitter_is_linear_in_the_sample(self) -> None:
        assert DEFAULT_POLICY.next_delay(2, age=10.0, jitter_sample=0.5) == pytest.approx(18.0)

    def test_zero_jitter_policy_ignores_sample(self) -> None:
        assert RetryPolicy(jitter=0).next_delay(3, age=30.0, jitter_sample=0.9) == 40.0

    @pytest.mark.parametrize("sample", [-0.01, 1.01, math.nan])
    def test_rejects_sample_out_of_range(self, sample: float) -> None:
        with pytest.raises(ValueError):
            DEFAULT_POLICY.next_delay(1, age=0.0, jitter_sample=sample)

    @pytest.mark.parametrize("age", [math.nan, math.inf])
    def test_rejects_non_finite_age(self, age: float) -> None:
        with pytest.raises(ValueError):
            DEFAULT_POLICY.next_delay(1, age=age, jitter_sample=0.0)

    def test_rejects_attempt_zero(self) -> None:
        with pytest.raises(ValueError):
            DEFAULT_POLICY.next_delay(0, age=0.0, jitter_sample=0.0)

    def test_cap_reached(self) -> None:
        assert DEFAULT_POLICY.next_delay(11, age=10230.0, jitter_sample=0.0) == 7200.0
        assert DEFAULT_POLICY.next_delay(30, age=20000.0, jitter_sample=1.0) == pytest.approx(5760.0)

    def test_final_attempt_lands_exactly_on_the_ceiling(self) -> None:
        # Attempt 21 fails at 82230 s; a 2 h gap would overshoot, so attempt 22 is at 86400 s.
        assert DEFAULT_POLICY.next_delay(21, age=82230.0, jitter_sample=0.0) == 4170.0

    def test_dead_after_the_attempt_at_the_ceiling(self) -> None:
        assert DEFAULT_POLICY.next_delay(22, age=86400.0, jitter_sample=0.0) is None
        # In practice the final attempt fails a little after the ceiling.
        assert DEFAULT_POLICY.next_delay(22, age=86400.7, jitter_sample=0.0) is None

    def test_gap_that_ends_exactly_on_the_ceiling_is_not_shortened(self) -> None:
        assert DEFAULT_POLICY.next_delay(12, age=86400.0 - 7200.0, jitter_sample=0.0) == 7200.0

    def test_just_before_the_ceiling_there_is_still_one_attempt(self) -> None:
        assert DEFAULT_POLICY.next_delay(3, age=86399.5, jitter_sample=0.0) == pytest.approx(0.5)

    def test_max_attempts_one_means_no_retry(self) -> None:
        assert RetryPolicy(max_attempts=1).next_delay(1, age=0.0, jitter_sample=0.0) is None

    def test_max_attempts_counts_the_attempt_that_just_failed(self) -> None:
        policy = RetryPolicy(max_attempts=3)
        assert policy.next_delay(2, age=10.0, jitter_sample=0.0) == 20.0
        assert policy.next_delay(3, age=30.0, jitter_sample=0.0) is None


class TestRetryAfterInNextDelay:
    def test_raises_the_gap(self) -> None:
        assert DEFAULT_POLICY.next_delay(1, age=0.0, jitter_sample=0.0, retry_after=120.0) == 120.0

    def test_never_shortens_the_gap(self) -> None:
        assert DEFAULT_POLICY.next_delay(5, age=150.0, jitter_sample=0.0, retry_after=5.0) == 160.0

    def test_replaces_jitter_when_larger(self) -> None:
        assert DEFAULT_POLICY.next_delay(1, age=0.0, jitter_sample=1.0, retry_after=9.5) == 9.5

    @pytest.mark.parametrize("retry_after", [7201.0, 1e12, math.inf])
    def test_clamped_to_max_interval(self, retry_after: float) -> None:
        assert DEFAULT_POLICY.next_delay(1, age=0.0, jitter_sample=0.0, retry_after=retry_after) == 7200.0

    @pytest.mark.parametrize("retry_after", [0.0, -30.0, math.nan])
    def test_meaningless_values_are_ignored(self, retry_after: float) -> None:
        assert DEFAULT_POLICY.next_delay(1, age=0.0, jitter_sample=0.0, retry_after=retry_after) == 10.0

    def test_cannot_push_past_the_ceiling(self) -> None:
        assert DEFAULT_POLICY.next_delay(20, age=86000.0, jitter_sample=0.0, retry_after=3600.0) == 400.0

    def test_cannot_revive_an_exhausted_row(self) -> None:
        assert RetryPolicy(max_attempts=1).next_delay(1, age=0.0, jitter_sample=0.0, retry_after=60.0) is None


class TestSchedule:
    def test_default_schedule(self) -> None:
        assert DEFAULT_POLICY.schedule() == DEFAULT_OFFSETS

    def test_default_attempt_count(self) -> None:
        assert len(DEFAULT_POLICY.schedule()) == 22

    def test_full_jitter_fits_more_attempts(self) -> None:
        offsets = DEFAULT_POLICY.schedule(jitter_sample=1.0)
        assert len(offsets) == 25
        assert offsets[-1] == 86400.0

    def test_monotone_and_ends_at_ceiling(self) -> None:
        offsets = DEFAULT_POLICY.schedule()
        assert offsets[0] == 0.0
        assert all(a < b for a, b in zip(offsets, offsets[1:], strict=False))
        assert offsets[-1] == DEFAULT_POLICY.ceiling

    def test_max_attempts_one(self) -> None:
        assert RetryPolicy(max_attempts=1).schedule() == [0.0]

    def test_max_attempts_truncates(self) -> None:
        assert RetryPolicy(max_attempts=4).schedule() == [0.0, 10.0, 30.0, 70.0]

    def test_zero_ceiling_means_one_attempt(self) -> None:
        assert RetryPolicy(ceiling=0).schedule() == [0.0]

    def test_schedule_agrees_with_next_delay(self) -> None:
        offsets = DEFAULT_POLICY.schedule()
        for n, (age, following) in enumerate(zip(offsets, offsets[1:], strict=False), start=1):
            assert DEFAULT_POLICY.next_delay(n, age=age, jitter_sample=0.0) == following - age
        assert DEFAULT_POLICY.next_delay(len(offsets), age=offsets[-1], jitter_sample=0.0) is None


class TestRetryPolicies:
    def test_override_and_fallback(self) -> None:
        location = RetryPolicy(max_attempts=1)
        policies = RetryPolicies(default=DEFAULT_POLICY, by_event_type={"technician.location": location})
        assert policies.for_event_type("technician.location") is location
        assert policies.for_event_type("job.created") is DEFAULT_POLICY

    def test_default_policies_follow_decision_q1(self) -> None:
        assert DEFAULT_POLICIES.for_event_type("technician.location").max_attempts == 1
        assert DEFAULT_POLICIES.for_event_type("job.completed") == RetryPolicy()

    def test_copies_the_callers_mapping(self) -> None:
        source = {"a": RetryPolicy(max_attempts=2)}
        policies = RetryPolicies(default=DEFAULT_POLICY, by_event_type=source)
        source["b"] = RetryPolicy(max_attempts=3)
        assert policies.for_event_type("b") is DEFAULT_POLICY

    def test_mapping_is_read_only(self) -> None:
        policies = RetryPolicies(default=DEFAULT_POLICY, by_event_type={"a": RetryPolicy()})
        with pytest.raises(TypeError):
            policies.by_event_type["b"] = RetryPolicy()  # type: ignore[index]

    def test_frozen_hashable_and_comparable(self) -> None:
        a = RetryPolicies(default=DEFAULT_POLICY, by_event_type={"x": RetryPolicy(max_attempts=1)})
        b = RetryPolicies(default=DEFAULT_POLICY, by_event_type={"x": RetryPolicy(max_attempts=1)})
        c = RetryPolicies(default=DEFAULT_POLICY, by_event_type={"x": RetryPolicy(max_attempts=2)})
        assert a == b and hash(a) == hash(b)
        assert a != c
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.default = RetryPolicy()  # type: ignore[misc]

    def test_rejects_non_policy_values(self) -> None:
        with pytest.raises(ValueError):
            RetryPolicies(default=DEFAULT_POLICY, by_event_type={"x": {"max_attempts": 1}})  # type: ignore[dict-item]


# ---------------------------------------------------------------- Retry-After


class TestParseRetryAfter:
    @pytest.mark.parametrize(("value", "seconds"), [("120", 120.0), ("0", 0.0), (" 7 ", 7.0), ("007", 7.0)])
    def test_delay_seconds(self, value: str, seconds: float) -> None:
        assert parse_retry_after(value, NOW) == seconds

    @pytest.mark.parametrize(
        "value",
        [None, "", "   ", "garbage", "-5", "1.5", "1e3", "+5", "5s", "\u0663", "Wed, 99 Foo 2026 xx:yy:zz GMT"],
    )
    def test_invalid_or_negative_is_none(self, value: str | None) -> None:
        assert parse_retry_after(value, NOW) is None

    def test_huge_delay_seconds_parse_and_are_left_to_the_caller_to_clamp(self) -> None:
        assert parse_retry_after("9" * 40, NOW) == float("9" * 40)
        assert parse_retry_after("9" * 400, NOW) == math.inf

    @pytest.mark.parametrize(
        "value",
        [
            "Tue, 22 Sep 2026 12:01:30 GMT",  # IMF-fixdate
            "Tuesday, 22-Sep-26 12:01:30 GMT",  # obsolete RFC 850
            "Tue Sep 22 12:01:30 2026",  # obsolete asctime, GMT by definition
            "Tue, 22 Sep 2026 14:01:30 +0200",  # not HTTP, but unambiguous
        ],
    )
    def test_http_date_forms(self, value: str) -> None:
        assert parse_retry_after(value, NOW) == 90.0

    def test_http_date_now_is_zero(self) -> None:
        assert parse_retry_after("Tue, 22 Sep 2026 12:00:00 GMT", NOW) == 0.0

    def test_http_date_in_the_past_is_none(self) -> None:
        assert parse_retry_after("Tue, 22 Sep 2026 11:59:59 GMT", NOW) is None

    def test_http_date_uses_the_given_clock(self) -> None:
        assert parse_retry_after("Tue, 22 Sep 2026 12:01:30 GMT", NOW + 30) == 60.0


# ---------------------------------------------------------------- classify


class TestClassifyStatus:
    @pytest.mark.parametrize("status", [200, 201, 204, 299])
    def test_2xx_delivered(self, status: int) -> None:
        assert outcome_of(response(status)) == Outcome(Verdict.DELIVERED, "delivered", None, OK, None)

    @pytest.mark.parametrize(
        ("status", "label"),
        [
            (300, "http_3xx"), (301, "http_3xx"), (399, "http_3xx"),
            (400, "http_4xx"), (404, "http_4xx"), (429, "http_4xx"), (499, "http_4xx"),
            (500, "http_5xx"), (503, "http_5xx"), (599, "http_5xx"),
        ],
    )  # fmt: skip
    def test_3xx_4xx_5xx_retry(self, status: int, label: str) -> None:
        assert outcome_of(response(status)) == Outcome(Verdict.RETRY, label, 10.0, FAIL, f"HTTP {status}")  # type: ignore[arg-type]

    @pytest.mark.parametrize("status", [100, 101, 199, 600, 999, 0, -1])
    def test_1xx_final_and_out_of_range_are_protocol_failures(self, status: int) -> None:
        outcome = outcome_of(response(status))
        assert (outcome.verdict, outcome.result, outcome.delay, outcome.breaker) == (
            Verdict.RETRY,
            "protocol",
            10.0,
            FAIL,
        )
        assert outcome.error == f"protocol: unexpected status {status}"

    def test_delay_comes_from_the_policy(self) -> None:
        outcome = outcome_of(response(500), attempt=4, age=70.0, sample=0.5)
        assert outcome.delay == pytest.approx(72.0)

    def test_final_attempt_at_the_ceiling(self) -> None:
        outcome = outcome_of(response(500), attempt=21, age=82230.0)
        assert (outcome.verdict, outcome.delay) == (Verdict.RETRY, 4170.0)

    def test_dead_after_the_ceiling(self) -> None:
        outcome = outcome_of(response(502), attempt=22, age=86400.3)
        assert outcome == Outcome(Verdict.DEAD, "http_5xx", None, FAIL, "HTTP 502")

    def test_dead_when_attempts_exhausted(self) -> None:
        outcome = outcome_of(response(500), policy=RetryPolicy(max_attempts=1))
        assert outcome == Outcome(Verdict.DEAD, "http_5xx", None, FAIL, "HTTP 500")

    def test_2xx_delivered_even_past_the_ceiling_and_budget(self) -> None:
        outcome = outcome_of(response(200), attempt=99, age=1e6, policy=RetryPolicy(max_attempts=1))
        assert outcome.verdict is Verdict.DELIVERED


class TestClassifyRetryAfter:
    @pytest.mark.parametrize("status", [429, 503])
    def test_delay_seconds_honoured(self, status: int) -> None:
        assert outcome_of(response(status, retry_after="120")).delay == 120.0

    @pytest.mark.parametrize("status", [429, 503])
    def test_http_date_honoured(self, status: int) -> None:
        assert outcome_of(response(status, retry_after=formatdate(NOW + 600, usegmt=True))).delay == 600.0

    @pytest.mark.parametrize("value", ["garbage", "-120", "", formatdate(NOW - 600, usegmt=True)])
    def test_unusable_falls_back_to_the_schedule(self, value: str) -> None:
        assert outcome_of(response(429, retry_after=value)).delay == 10.0

    @pytest.mark.parametrize("value", ["86400", "9" * 400, formatdate(NOW + 10**7, usegmt=True)])
    def test_huge_is_clamped_to_max_interval(self, value: str) -> None:
        assert outcome_of(response(503, retry_after=value)).delay == 7200.0

    @pytest.mark.parametrize("status", [500, 502, 301, 404])
    def test_ignored_on_other_statuses(self, status: int) -> None:
        assert outcome_of(response(status, retry_after="120")).delay == 10.0

    def test_ignored_on_success(self) -> None:
        assert outcome_of(response(200, retry_after="120")).verdict is Verdict.DELIVERED

    def test_ceiling_still_wins(self) -> None:
        outcome = outcome_of(response(429, retry_after="3600"), attempt=20, age=86000.0)
        assert (outcome.verdict, outcome.delay) == (Verdict.RETRY, 400.0)


class TestClassifyErrors:
    @pytest.mark.parametrize("error", RETRYABLE_ERRORS)
    def test_retryable(self, error: str) -> None:
        outcome = outcome_of(response(error=error, detail="boom"))
        assert outcome == Outcome(Verdict.RETRY, error, 10.0, FAIL, f"{error}: boom")  # type: ignore[arg-type]

    @pytest.mark.parametrize("error", RETRYABLE_ERRORS)
    def test_retryable_errors_go_dead_when_exhausted(self, error: str) -> None:
        outcome = outcome_of(response(error=error), attempt=22, age=86400.0)
        assert (outcome.verdict, outcome.result, outcome.breaker, outcome.error) == (Verdict.DEAD, error, FAIL, error)

    @pytest.mark.parametrize("error", UNSENDABLE_ERRORS)
    def test_unsendable_fail_without_burning_retries(self, error: str) -> None:
        outcome = outcome_of(response(error=error, detail="10.0.0.1 is private"))
        assert outcome == Outcome(Verdict.FAILED, error, None, IGN, f"{error}: 10.0.0.1 is private")  # type: ignore[arg-type]

    @pytest.mark.parametrize("error", UNSENDABLE_ERRORS)
    def test_unsendable_stay_failed_not_dead_when_exhausted(self, error: str) -> None:
        outcome = outcome_of(response(error=error), policy=RetryPolicy(max_attempts=1))
        assert outcome.verdict is Verdict.FAILED

    def test_error_wins_over_a_status(self) -> None:
        outcome = outcome_of(response(200, error="timeout", detail="body read"))
        assert (outcome.verdict, outcome.result, outcome.breaker) == (Verdict.RETRY, "timeout", FAIL)

    def test_retry_after_ignored_without_a_status(self) -> None:
        assert outcome_of(response(error="connection", retry_after="600")).delay == 10.0

    def test_long_detail_is_clipped(self) -> None:
        outcome = outcome_of(response(error="tls", detail="x" * 10_000))
        assert outcome.error is not None
        assert len(outcome.error) == ERROR_TEXT_LIMIT
        assert outcome.error.startswith("tls: xxx")

    def test_neither_status_nor_error_breaks_the_contract(self) -> None:
        with pytest.raises(ValueError):
            outcome_of(response(None))

    def test_unknown_error_class_breaks_the_contract(self) -> None:
        with pytest.raises(ValueError):
            outcome_of(response(error="cosmic_ray"))

    def test_error_classes_cover_the_transport_contract(self) -> None:
        assert set(RETRYABLE_ERRORS) | set(UNSENDABLE_ERRORS) == set(get_args(ErrorClass))
        assert set(RETRYABLE_ERRORS) == policy_module.RETRYABLE_ERRORS
        assert set(UNSENDABLE_ERRORS) == policy_module.UNSENDABLE_ERRORS


class TestTerminal:
    def test_terminal(self) -> None:
        assert terminal("endpoint deleted") == Outcome(Verdict.FAILED, "failed", None, IGN, "endpoint deleted")

    def test_terminal_reason_is_clipped(self) -> None:
        assert len(terminal("r" * 1000).error or "") == ERROR_TEXT_LIMIT


# ---------------------------------------------------------------- breaker

BREAKER = BreakerPolicy()
T0 = NOW


def opened_at(t: float, failures: int = 20) -> EndpointBreaker:
    return EndpointBreaker("open", failures, t + 300.0)


class TestBreakerValues:
    def test_defaults_match_the_rfc(self) -> None:
        assert (BREAKER.failure_threshold, BREAKER.open_for) == (20, 300.0)
        assert EndpointBreaker("closed", 0, None) == CLOSED

    @pytest.mark.parametrize("kwargs", [{"failure_threshold": 0}, {"open_for": 0}, {"open_for": math.inf}])
    def test_policy_rejects_invalid(self, kwargs: dict[str, Any]) -> None:
        with pytest.raises(ValueError):
            BreakerPolicy(**kwargs)

    @pytest.mark.parametrize(("state", "failures"), [("opened", 0), ("OPEN", 0), ("closed", -1)])
    def test_snapshot_rejects_invalid(self, state: str, failures: int) -> None:
        with pytest.raises(ValueError):
            EndpointBreaker(state, failures, None)


class TestAdmits:
    def test_closed_sends(self) -> None:
        assert BREAKER.admits(CLOSED, T0) == "send"
        assert BREAKER.admits(EndpointBreaker("closed", 19, None), T0) == "send"

    @pytest.mark.parametrize("state", ["open", "half_open"])
    @pytest.mark.parametrize(("now", "admission"), [(T0 - 0.001, "skip"), (T0, "probe"), (T0 + 1, "probe")])
    def test_deadline_boundary(self, state: str, now: float, admission: str) -> None:
        # open: the cool-off window ends at open_until; half_open: the probe lease does.
        assert BREAKER.admits(EndpointBreaker(state, 20, T0), now) == admission

    @pytest.mark.parametrize("state", ["open", "half_open"])
    def test_missing_deadline_does_not_wedge(self, state: str) -> None:
        assert BREAKER.admits(EndpointBreaker(state, 20, None), T0) == "probe"


class TestAfter:
    def test_nineteen_failures_stay_closed(self) -> None:
        assert BREAKER.after(CLOSED, [FAIL] * 19, T0) == EndpointBreaker("closed", 19, None)

    def test_twentieth_failure_opens(self) -> None:
        assert BREAKER.after(CLOSED, [FAIL] * 20, T0) == EndpointBreaker("open", 20, T0 + 300.0)

    def test_threshold_across_batches(self) -> None:
        b = BREAKER.after(CLOSED, [FAIL] * 19, T0)
        assert BREAKER.after(b, [FAIL], T0 + 5) == EndpointBreaker("open", 20, T0 + 305.0)

    def test_ignore_does_not_count_or_reset(self) -> None:
        b = BREAKER.after(CLOSED, [FAIL] * 19 + [IGN] * 50, T0)
        assert b == EndpointBreaker("closed", 19, None)
        assert BREAKER.after(b, [FAIL], T0).state == "open"

    def test_success_resets(self) -> None:
        b = BREAKER.after(CLOSED, [FAIL] * 19 + [OK] + [FAIL] * 19, T0)
        assert b == EndpointBreaker("closed", 19, None)

    def test_signals_apply_in_order(self) -> None:
        assert BREAKER.after(CLOSED, [FAIL] * 20 + [OK], T0) == CLOSED
        assert BREAKER.after(CLOSED, [OK] + [FAIL] * 20, T0).state == "open"

    def test_no_signals_no_change(self) -> None:
        b = opened_at(T0)
        assert BREAKER.after(b, [], T0 + 1) is b

    def test_failure_inside_the_window_does_not_extend_it(self) -> None:
        assert BREAKER.after(opened_at(T0), [FAIL, FAIL], T0 + 10) == EndpointBreaker("open", 22, T0 + 300.0)

    def test_failure_after_the_window_lapsed_reopens(self) -> None:
        # A probe run while the row still says "open": without a new window the
        # endpoint would be probed on every poll.
        assert BREAKER.after(opened_at(T0), [FAIL], T0 + 300.0) == EndpointBreaker("open", 21, T0 + 600.0)

    def test_half_open_failure_reopens_for_another_window(self) -> None:
        probing = EndpointBreaker("half_open", 20, T0 + 330.0)
        assert BREAKER.after(probing, [FAIL], T0 + 310.0) == EndpointBreaker("open", 21, T0 + 610.0)

    def test_half_open_success_closes(self) -> None:
        assert BREAKER.after(EndpointBreaker("half_open", 20, T0 + 330.0), [OK], T0 + 310.0) == CLOSED

    def test_half_open_ignore_keeps_the_lease(self) -> None:
        probing = EndpointBreaker("half_open", 20, T0 + 330.0)
        assert BREAKER.after(probing, [IGN], T0 + 310.0) == probing

    def test_success_while_open_closes(self) -> None:
        assert BREAKER.after(opened_at(T0), [OK], T0 + 1) == CLOSED

    def test_threshold_of_one(self) -> None:
        assert BreakerPolicy(failure_threshold=1, open_for=60).after(CLOSED, [FAIL], T0) == EndpointBreaker(
            "open", 1, T0 + 60
        )


class TestTransitions:
    @pytest.mark.parametrize(
        ("old", "new", "label"),
        [
            (CLOSED, EndpointBreaker("closed", 3, None), None),
            (EndpointBreaker("closed", 19, None), EndpointBreaker("open", 20, T0 + 300), "opened"),
            (EndpointBreaker("half_open", 20, T0), EndpointBreaker("open", 21, T0 + 300), "reopened"),
            (EndpointBreaker("open", 20, T0), EndpointBreaker("open", 21, T0 + 300), "reopened"),
            (EndpointBreaker("open", 20, T0), EndpointBreaker("open", 21, T0), None),
            (EndpointBreaker("open", 20, T0), EndpointBreaker("half_open", 20, T0 + 30), "half_opened"),
            (EndpointBreaker("half_open", 20, T0), EndpointBreaker("half_open", 20, T0 + 30), None),
            (EndpointBreaker("half_open", 20, T0), CLOSED, "closed"),
            (EndpointBreaker("open", 20, T0), CLOSED, "closed"),
        ],
    )
    def test_labels(self, old: EndpointBreaker, new: EndpointBreaker, label: str | None) -> None:
        assert BreakerPolicy.transitions(old, new) == label

    def test_labels_of_real_sequences(self) -> None:
        b19 = BREAKER.after(CLOSED, [FAIL] * 19, T0)
        b20 = BREAKER.after(b19, [FAIL], T0)
        assert BREAKER.transitions(b19, b20) == "opened"
        probing = EndpointBreaker("half_open", b20.consecutive_failures, T0 + 330)
        assert BREAKER.transitions(b20, probing) == "half_opened"
        assert BREAKER.transitions(probing, BREAKER.after(probing, [FAIL], T0 + 301)) == "reopened"
        assert BREAKER.transitions(probing, BREAKER.after(probing, [OK], T0 + 301)) == "closed"


# ---------------------------------------------------------------- docs


def _generated_block(text: str) -> str:
    start, end = "<!-- BEGIN GENERATED: python -m dispatcher.rules.retry -->", "<!-- END GENERATED -->"
    assert start in text and end in text, "docs/retry-schedule.md lost its generated-block markers"
    return text.split(start, 1)[1].split(end, 1)[0].strip()


class TestDocs:
    def test_doc_matches_the_code(self) -> None:
        assert _generated_block(DOC.read_text(encoding="utf-8")) == schedule_markdown().strip(), (
            "docs/retry-schedule.md is stale: paste the output of `python -m dispatcher.rules.retry`"
        )

    def test_module_prints_the_generated_block(self) -> None:
        out = subprocess.run(
            [sys.executable, "-m", "dispatcher.rules.retry"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == schedule_markdown().strip()

    def test_importing_policy_does_not_load_the_network_stack(self) -> None:
        # The worker monkey-patches socket/ssl with gevent first; a pure module
        # that dragged them in could be imported too early by accident.
        code = "import sys, dispatcher.rules.retry; print(sorted({'gevent', 'ssl', 'urllib3'} & set(sys.modules)))"
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "[]"

    def test_table_rows(self) -> None:
        table = backoff_table(DEFAULT_POLICY)
        assert "| 1 | 0 | 0 s | — |" in table
        assert "| 11 | 10230 | 2 h 50 min 30 s | 1 h 25 min 20 s |" in table
        assert "| 22 | 86400 | 24 h | 1 h 9 min 30 s (ceiling) |" in table
        assert "| 23 |" not in table

    def test_markdown_mentions_counts_and_location(self) -> None:
        text = schedule_markdown()
        assert "22 attempts" in text and "up to 25 attempts" in text
        assert "`technician.location`" in text and "max_attempts 1; 1 attempt(s)" in text


# ---------------------------------------------------------------- properties

policies = st.builds(
    RetryPolicy,
    base=st.floats(0.01, 1000),
    max_interval=st.floats(0.01, 100_000),
    ceiling=st.floats(0, 1_000_000),
    max_attempts=st.none() | st.integers(1, 50),
    jitter=st.floats(0, 0.99),
)
samples = st.floats(0, 1)
ages = st.floats(-1000, 2_000_000)
attempts = st.integers(1, 3000)
retry_afters = st.none() | st.floats(allow_nan=True, allow_infinity=True)


# Inputs for which the row is still alive (inside its window and budget), drawn
# directly rather than filtered, so the properties about live delays get
# their full example budget instead of tripping hypothesis' filter health check.
live_policies = policies.filter(lambda p: p.ceiling > 0 and (p.max_attempts is None or p.max_attempts > 1))


@st.composite
def live_cases(draw: st.DrawFn) -> tuple[RetryPolicy, int, float]:
    policy = draw(live_policies)
    last = 3000 if policy.max_attempts is None else policy.max_attempts - 1
    return policy, draw(st.integers(1, last)), draw(st.floats(-1000, policy.ceiling, exclude_max=True))


def _within_ceiling(age: float, delay: float, ceiling: float) -> bool:
    # age + (ceiling - age) may round by an ulp; the engine adds in SQL anyway.
    return age + delay <= ceiling + 1e-9 * max(1.0, abs(ceiling), abs(age))


class TestProperties:
    @given(policies, attempts, ages, samples, retry_afters)
    def test_next_delay_is_positive_bounded_and_inside_the_ceiling(
        self, policy: RetryPolicy, attempt: int, age: float, sample: float, retry_after: float | None
    ) -> None:
        delay = policy.next_delay(attempt, age, sample, retry_after)
        if delay is None:
            return
        assert 0 < delay <= policy.max_interval
        assert _within_ceiling(age, delay, policy.ceiling)

    @given(policies, attempts, ages, samples, retry_afters)
    def test_dead_exactly_when_out_of_window_or_budget(
        self, policy: RetryPolicy, attempt: int, age: float, sample: float, retry_after: float | None
    ) -> None:
        out_of_budget = policy.max_attempts is not None and attempt >= policy.max_attempts
        expected_dead = out_of_budget or age >= policy.ceiling
        assert (policy.next_delay(attempt, age, sample, retry_after) is None) == expected_dead

    @given(live_cases(), samples)
    def test_delay_is_the_jittered_gap_unless_the_ceiling_cuts_it(
        self, case: tuple[RetryPolicy, int, float], sample: float
    ) -> None:
        policy, attempt, age = case
        delay = policy.next_delay(attempt, age, sample)
        assert delay is not None
        nominal = policy.nominal_gap(attempt)
        assert delay <= nominal * (1 + 1e-12)
        assert delay >= min(nominal * (1 - policy.jitter), policy.ceiling - age) * (1 - 1e-9)

    @given(live_cases(), samples, st.floats(0.001, 1e9))
    def test_retry_after_is_honoured_up_to_the_cap_and_ceiling(
        self, case: tuple[RetryPolicy, int, float], sample: float, retry_after: float
    ) -> None:
        policy, attempt, age = case
        delay = policy.next_delay(attempt, age, sample, retry_after)
        assert delay is not None
        floor = min(retry_after, policy.max_interval, policy.ceiling - age)
        assert delay >= floor * (1 - 1e-9)

    @given(policies, attempts, ages, samples, samples)
    def test_more_jitter_never_lengthens_the_gap(
        self, policy: RetryPolicy, attempt: int, age: float, s1: float, s2: float
    ) -> None:
        low, high = sorted((s1, s2))
        d_low, d_high = policy.next_delay(attempt, age, low), policy.next_delay(attempt, age, high)
        assert (d_low is None) == (d_high is None)
        if d_low is not None and d_high is not None:
            assert d_high <= d_low

    @given(policies, st.integers(1, 5000))
    def test_nominal_gaps_are_monotone_positive_and_capped(self, policy: RetryPolicy, attempt: int) -> None:
        gap, following = policy.nominal_gap(attempt), policy.nominal_gap(attempt + 1)
        assert 0 < gap <= following <= policy.max_interval

    @given(
        base=st.floats(1, 1000),
        max_interval=st.floats(1, 10_000),
        intervals=st.floats(0, 200),
        max_attempts=st.none() | st.integers(1, 30),
        jitter=st.floats(0, 0.9),
        sample=samples,
    )
    def test_schedule_is_increasing_and_ends_at_the_ceiling(
        self,
        base: float,
        max_interval: float,
        intervals: float,
        max_attempts: int | None,
        jitter: float,
        sample: float,
    ) -> None:
        policy = RetryPolicy(base, max_interval, max_interval * intervals, max_attempts, jitter)
        offsets = policy.schedule(sample)
        assert offsets[0] == 0.0
        # Offsets are running sums, so a difference can exceed the cap by an ulp.
        assert all(0 < b - a <= max_interval * (1 + 1e-9) for a, b in zip(offsets, offsets[1:], strict=False))
        assert offsets[-1] <= policy.ceiling
        if max_attempts is None:
            assert offsets[-1] == policy.ceiling
        else:
            assert len(offsets) <= max_attempts
            assert len(offsets) == max_attempts or offsets[-1] == policy.ceiling

    @given(
        base=st.floats(1, 1000),
        max_interval=st.floats(1, 10_000),
        intervals=st.floats(0, 100),
        jitter=st.floats(0, 0.5),
    )
    def test_jitter_only_adds_attempts(self, base: float, max_interval: float, intervals: float, jitter: float) -> None:
        policy = RetryPolicy(base, max_interval, max_interval * intervals, None, jitter)
        assert len(policy.schedule(1.0)) >= len(policy.schedule(0.0))

    @given(st.integers(0, 10**15))
    def test_delay_seconds_round_trip(self, seconds: int) -> None:
        assert parse_retry_after(str(seconds), NOW) == float(seconds)

    @given(st.integers(0, 10**8))
    def test_http_date_round_trip(self, seconds: int) -> None:
        assert parse_retry_after(formatdate(NOW + seconds, usegmt=True), NOW) == float(seconds)

    @given(st.text(max_size=60))
    def test_any_header_text_is_safe(self, value: str) -> None:
        parsed = parse_retry_after(value, NOW)
        assert parsed is None or parsed >= 0

    @given(
        status=st.none() | st.integers(-1000, 1000),
        error=st.none() | st.sampled_from(get_args(ErrorClass)),
        detail=st.text(max_size=400),
        retry_after=st.none() | st.text(max_size=40) | st.integers(0, 10**6).map(str),
        attempt=attempts,
        age=ages,
        sample=samples,
    )
    def test_classify_invariants(
        self,
        status: int | None,
        error: ErrorClass | None,
        detail: str,
        retry_after: str | None,
        attempt: int,
        age: float,
        sample: float,
    ) -> None:
        assume(status is not None or error is not None)
        result = TransportResult(status, b"", error, detail, retry_after, 0.0)
        outcome = classify(result, attempt, age, DEFAULT_POLICY, NOW, sample)
        assert outcome.result in get_args(ResultLabel)
        expected_breaker = {
            Verdict.DELIVERED: OK, Verdict.FAILED: IGN, Verdict.RETRY: FAIL, Verdict.DEAD: FAIL,
        }[outcome.verdict]  # fmt: skip
        assert outcome.breaker is expected_breaker
        assert (outcome.verdict is Verdict.RETRY) == (outcome.delay is not None)
        assert (outcome.verdict is Verdict.DELIVERED) == (error is None and status is not None and 200 <= status <= 299)
        assert (outcome.error is None) == (outcome.verdict is Verdict.DELIVERED)
        assert outcome.error is None or len(outcome.error) <= ERROR_TEXT_LIMIT
        if outcome.delay is not None:
            assert 0 < outcome.delay <= DEFAULT_POLICY.max_interval
            assert _within_ceiling(age, outcome.delay, DEFAULT_POLICY.ceiling)

    @given(st.integers(1, 10), st.lists(st.sampled_from([OK, FAIL, IGN]), max_size=60))
    def test_breaker_counts_failures_since_the_last_success(self, threshold: int, signals: list[BreakerSignal]) -> None:
        # All signals at one instant, so an opened breaker's window never lapses.
        breaker = BreakerPolicy(failure_threshold=threshold).after(CLOSED, signals, T0)
        since_success = signals[len(signals) - signals[::-1].index(OK) :] if OK in signals else signals
        failures = since_success.count(FAIL)
        assert breaker.consecutive_failures == failures
        assert breaker.state == ("open" if failures >= threshold else "closed")
        assert breaker.open_until == (T0 + 300.0 if failures >= threshold else None)
