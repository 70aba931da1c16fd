"""The bulk replay rule (``rules.bulk_replay``): which filters are refused, and what progress reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.rules.bulk_replay import BulkReplayPolicy, ReplayFilter, filter_problem, percent

NOW = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
MAX_AGE = 30 * 86400.0
SINCE = NOW - timedelta(hours=6)


@pytest.mark.parametrize(("changes", "named"), [
    ({}, None),
    ({"since": NOW - timedelta(days=31)}, "30 days back"),
    ({"since": NOW + timedelta(minutes=1)}, "future"),
    ({"until": SINCE}, "until must be later"),
    ({"statuses": ()}, "at least one status"),
    ({"statuses": ("dead", "pending")}, "'pending' cannot be replayed"),
    ({"statuses": ("shadow",)}, "'shadow' cannot be replayed"),
    ({"statuses": ("delivered",)}, None),
    ({"types": tuple(f"t{n}" for n in range(21))}, "at most 20 event types"),
    ({"types": ("",)}, "1 to 200 characters"),
    ({"endpoints": tuple(range(1, 102))}, "at most 100 endpoints"),
    ({"endpoints": (0,)}, "positive integer"),
    ({"endpoints": (2**63,)}, "positive integer"),
])
def test_filter_problem_names_the_field(changes: dict[str, object], named: str | None) -> None:
    fields: dict[str, object] = {"since": SINCE, **changes}
    problem = filter_problem(ReplayFilter(**fields), NOW, MAX_AGE)  # type: ignore[arg-type]
    assert (problem is None) if named is None else (problem is not None and named in problem), problem


def test_the_fingerprint_ignores_list_order_but_not_content() -> None:
    a = ReplayFilter(SINCE, None, ("b", "a"), (2, 1), ("failed", "dead"))
    assert a.fingerprint() == ReplayFilter(SINCE, None, ("a", "b"), (1, 2), ("dead", "failed")).fingerprint()
    assert a.fingerprint() != ReplayFilter(SINCE, None, ("a",), (1, 2), ("dead", "failed")).fingerprint()
    assert a.fingerprint() != ReplayFilter(SINCE, NOW, ("a", "b"), (1, 2), ("dead", "failed")).fingerprint()
    # A defaulted since is the same request a moment later, a given one is not.
    later = SINCE + timedelta(seconds=5)
    assert ReplayFilter(SINCE, since_defaulted=True).fingerprint() == ReplayFilter(
        later, since_defaulted=True).fingerprint()
    assert ReplayFilter(SINCE).fingerprint() != ReplayFilter(later).fingerprint()


@pytest.mark.parametrize(("total", "queued", "done", "shown"), [
    (0, 0, False, 0), (0, 0, True, 100), (6, 2, False, 33), (6, 6, False, 99), (6, 6, True, 100),
    (6, 4, True, 100),  # two rows skipped (replayed meanwhile): done is done
])
def test_percent_reaches_100_only_when_done(total: int, queued: int, done: bool, shown: int) -> None:
    assert percent(total, queued, done) == shown


def test_the_policy_refuses_nonsense() -> None:
    assert BulkReplayPolicy().batch_rows == 500
    with pytest.raises(ValueError):
        BulkReplayPolicy(batch_rows=0)
