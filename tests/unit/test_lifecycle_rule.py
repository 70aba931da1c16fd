"""The endpoint lifecycle rule (dispatcher/rules/lifecycle.py) on one table of cases, and walks through
whole episodes: each stage once per episode, no storm from a flapping endpoint."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dispatcher.rules.lifecycle import Decision, Facts, LifecyclePolicy, decide

HOUR, DAY = 3600.0, 86400.0
POLICY = LifecyclePolicy(disable_after=3 * DAY, warn_before=DAY, hold_for=7 * DAY, flap_window=HOUR)
NOW = 1_000_000_000.0
OPEN = Facts(breaker_closed=False)
CLOSED = Facts(breaker_closed=True)


def running(since_ago: float, *sent: str, **more: object) -> Facts:
    """A failing episode (number 1) that began ``since_ago`` seconds before NOW."""
    fields: dict[str, object] = {"breaker_closed": False, "episode": 1, "running": True,
                                 "failing_since": NOW - since_ago, "sent": frozenset(sent)}
    fields.update(more)
    return Facts(**fields)  # type: ignore[arg-type]


# (case, facts, expected: stage, notices, pause, episode, next_step, next_step_at)
CASES = [
    ("healthy: nothing", CLOSED, ("healthy", (), False, 0, None, None)),
    ("breaker opens: a new episode, failing told, pause date shown",
     OPEN, ("failing", ("opened",), False, 1, "paused", NOW + 3 * DAY)),
    ("failing, told: silent", running(HOUR, "opened"), ("failing", (), False, 1, "paused", NOW + 3 * DAY - HOUR)),
    ("a day before the pause: will_pause",
     running(2 * DAY, "opened"), ("will_pause", ("will_pause",), False, 1, "paused", NOW + DAY)),
    ("will_pause told once", running(2 * DAY + HOUR, "opened", "will_pause"),
     ("will_pause", (), False, 1, "paused", NOW + DAY - HOUR)),
    ("disable_after reached: pause, paused told",
     running(3 * DAY, "opened", "will_pause"), ("paused", ("paused",), True, 1, "held events expire", NOW + 7 * DAY)),
    ("paused: expiry date shown", running(3 * DAY, "opened", "will_pause", "paused", paused_at=NOW - HOUR),
     ("paused", (), False, 1, "held events expire", NOW - HOUR + 7 * DAY)),
    ("a day before held events expire: expiring",
     running(9 * DAY, "opened", "will_pause", "paused", paused_at=NOW - 6 * DAY),
     ("paused", ("expiring",), False, 1, "held events expire", NOW + DAY)),
    ("the breaker closes: recovered once closed for the flap window, not before",
     running(HOUR, "opened", breaker_closed=True), ("failing", (), False, 1, "recovered", NOW + HOUR)),
    ("closed for the flap window: recovered, episode ends",
     running(3 * HOUR, "opened", breaker_closed=True, closed_at=NOW - HOUR),
     ("healthy", ("recovered",), False, 1, None, None)),
    ("reopened within the flap window: the same episode, silently",
     running(2 * HOUR, "opened", closed_at=NOW - HOUR / 2),
     ("failing", (), False, 1, "paused", NOW - 2 * HOUR + 3 * DAY)),
    ("resume (no longer paused, breaker reset): recovered at once",
     running(4 * DAY, "opened", "will_pause", "paused", breaker_closed=True),
     ("healthy", ("recovered",), False, 1, None, None)),
    ("a customer's pause of a healthy endpoint: an episode, paused told",
     Facts(breaker_closed=True, paused_at=NOW), ("paused", ("paused",), False, 1, "held events expire",
                                                  NOW + 7 * DAY)),
    ("a reopen after the episode ended: a new episode",
     Facts(breaker_closed=False, episode=1), ("failing", ("opened",), False, 2, "paused", NOW + 3 * DAY)),
    ("the operational endpoint is never paused", running(5 * DAY, "opened", pausable=False),
     ("failing", (), False, 1, None, None)),
]


@pytest.mark.parametrize(("facts", "expected"), [(f, e) for _, f, e in CASES], ids=[c for c, _, _ in CASES])
def test_cases(facts: Facts, expected: tuple[object, ...]) -> None:
    d = decide(POLICY, facts, NOW)
    assert (d.stage, d.notices, d.pause, d.episode, d.next_step, d.next_step_at) == expected


def _apply(facts: Facts, d: Decision, paused_at: float | None) -> Facts:
    """What the store keeps of a decision (the notices written join ``sent``)."""
    sent = (facts.sent if d.episode == facts.episode and facts.running else frozenset()) | set(d.notices)
    return replace(facts, episode=d.episode, running=d.running, failing_since=d.failing_since,
                   closed_at=d.closed_at, paused_at=paused_at, sent=frozenset(sent))


def test_a_whole_lifecycle_tells_each_stage_once() -> None:
    facts, told, now = OPEN, [], NOW
    for step in range(0, int(12 * DAY), int(HOUR)):
        now = NOW + step
        if step == int(9.5 * DAY):  # resumed on the last day of the hold: breaker reset, not paused
            facts = replace(facts, breaker_closed=True, paused_at=None)
        d = decide(POLICY, facts, now)
        told += d.notices
        facts = _apply(facts, d, now if d.pause else facts.paused_at)
    assert told == ["opened", "will_pause", "paused", "expiring", "recovered"]


def test_a_flapping_endpoint_sends_no_storm() -> None:
    """Open for a minute, closed for ten, for days: one failing notice, the pause warning and the
    pause (it kept reopening), and no recovered until it is resumed."""
    facts, told, paused = CLOSED, [], None
    for minute in range(0, 4 * 24 * 60 + 1):
        if paused is not None and minute == 4 * 24 * 60:  # resumed a day into the pause
            facts = replace(facts, breaker_closed=True, paused_at=None)
        elif paused is None:
            facts = replace(facts, breaker_closed=minute % 11 != 0)
        d = decide(POLICY, facts, NOW + minute * 60)
        told += d.notices
        paused = NOW + minute * 60 if d.pause else paused
        facts = _apply(facts, d, paused if facts.paused_at is not None or d.pause else None)
    assert told == ["opened", "will_pause", "paused", "recovered"]


def test_an_endpoint_that_fails_once_a_day_is_told_each_time() -> None:
    """Episodes far apart are separate: each tells failing and recovered."""
    facts, told = CLOSED, []
    for hour in range(0, 72):
        facts = replace(facts, breaker_closed=hour % 24 != 0)
        d = decide(POLICY, facts, NOW + hour * HOUR + 1)
        told += d.notices
        facts = _apply(facts, d, None)
    assert told == ["opened", "recovered"] * 3


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        LifecyclePolicy(disable_after=-1)
