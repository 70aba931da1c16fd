"""The back-off rule (``dispatcher.rules.backoff``) and the schedule each of its users keeps."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.engine.notifier import MailRetry
from dispatcher.engine.worker import CLAIM_BACKOFF, WRITE_BACKOFF
from dispatcher.rules.backoff import Backoff
from dispatcher.rules.retry import DEFAULT_POLICY
from dispatcher.runtime.supervisor import RESTART_BACKOFF

BACKOFFS = st.builds(
    Backoff,
    base=st.floats(1e-3, 1e4),
    factor=st.floats(1.0, 10.0),
    cap=st.one_of(st.floats(1e-3, 1e7), st.just(math.inf)),
    jitter=st.floats(0.0, 0.99),
)
ATTEMPTS = st.integers(1, 10**6)
DRAWS = st.floats(0.0, 1.0)


def test_a_doubling_schedule_up_to_its_cap() -> None:
    rule = Backoff(base=1.0, cap=10.0)
    assert [rule.nominal(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert [Backoff(base=2.0, factor=3.0).nominal(n) for n in (1, 2, 3)] == [2.0, 6.0, 18.0]


def test_jitter_only_shortens() -> None:
    rule = Backoff(base=10.0, jitter=0.2)
    assert (rule.delay(1, 0.0), rule.delay(1, 0.5), rule.delay(1, 1.0)) == (10.0, 9.0, 8.0)


def test_huge_attempt_numbers_reach_the_cap_without_overflow() -> None:
    assert Backoff(base=1e300, cap=1e301).nominal(2000) == 1e301
    assert Backoff(base=1.0).nominal(10**6) == math.inf  # no cap


@pytest.mark.parametrize("kwargs", [
    {"base": 0.0}, {"base": -1.0}, {"base": math.inf}, {"base": math.nan},
    {"base": 1.0, "factor": 0.5}, {"base": 1.0, "factor": math.inf},
    {"base": 1.0, "cap": 0.0}, {"base": 1.0, "cap": math.nan},
    {"base": 1.0, "jitter": 1.0}, {"base": 1.0, "jitter": -0.1},
])  # fmt: skip
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


@pytest.mark.parametrize(("attempt", "rand"), [(0, 0.0), (-1, 0.0), (1, -0.01), (1, 1.01), (1, math.nan)])
def test_bad_arguments_are_refused(attempt: int, rand: float) -> None:
    with pytest.raises(ValueError):
        Backoff(base=1.0).delay(attempt, rand)


@given(rule=BACKOFFS, attempt=ATTEMPTS, rand=DRAWS)
def test_a_delay_is_positive_capped_and_within_its_jitter(rule: Backoff, attempt: int, rand: float) -> None:
    nominal = rule.nominal(attempt)
    delay = rule.delay(attempt, rand)
    assert 0 < delay <= nominal <= rule.cap
    assert delay >= nominal * (1 - rule.jitter) * (1 - 1e-12)
    assert rule.delay(attempt, 0.0) == nominal


@given(rule=BACKOFFS, attempt=ATTEMPTS)
def test_the_nominal_schedule_never_shrinks(rule: Backoff, attempt: int) -> None:
    assert rule.nominal(attempt) <= rule.nominal(attempt + 1)


# ------------------------------------------------------------- each user keeps its schedule


def test_the_delivery_retry_schedule() -> None:
    """10 s doubling to 2 h, up to a fifth off (docs/retry-schedule.md)."""
    assert DEFAULT_POLICY.backoff == Backoff(base=10.0, factor=2.0, cap=7200.0, jitter=0.2)
    assert [DEFAULT_POLICY.nominal_gap(n) for n in range(1, 12)] == [
        10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 7200]


@pytest.mark.parametrize(("rule", "first"), [(CLAIM_BACKOFF, 0.1), (WRITE_BACKOFF, 0.05)])
@pytest.mark.parametrize("rand", [0.0, 0.25, 1.0])
def test_the_worker_database_backoff(rule: Backoff, first: float, rand: float) -> None:
    """From ``first``, doubling up to ``database.reconnect_max``, each wait drawn from [half, whole]."""
    capped = Backoff(rule.base, rule.factor, 1.0, rule.jitter)
    nominal = [min(first * 2 ** (n - 1), 1.0) for n in range(1, 8)]
    assert [capped.delay(n, rand) for n in range(1, 8)] == pytest.approx([g * (1 - 0.5 * rand) for g in nominal])


def test_the_supervisor_restart_backoff() -> None:
    assert [RESTART_BACKOFF.delay(n, 1.0) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_the_notice_mail_retries() -> None:
    retry = MailRetry(attempts=20, backoff=Backoff(base=60.0))
    assert [retry.delay_after(n) for n in (1, 2, 3, 10)] == [60.0, 120.0, 240.0, 60.0 * 2**9]
    assert retry.delay_after(20) is None
