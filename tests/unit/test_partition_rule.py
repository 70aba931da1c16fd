"""The partition policy (dispatcher/rules/partitions.py): ids that encode their day, which partitions the
upkeep creates ahead, which it drops whole, which wait and why.  The clock is an argument: no test sleeps."""

from __future__ import annotations

import datetime

import pytest

from dispatcher.config import config_from_mapping
from dispatcher.rules.health import (
    PARTITION_DAYS_AHEAD,
    BacklogFigures,
    BacklogRule,
    FleetFigures,
    FleetRule,
    Severity,
    Verdict,
    judge,
    partition_breaches,
)
from dispatcher.rules.partitions import (
    ATTEMPTS,
    DELIVERIES,
    EVENTS,
    EVENTS_LEGACY_END,
    LEGACY_ID_END,
    TABLES,
    Action,
    Kind,
    Partition,
    PartitionPolicy,
    ahead_days,
    before_name,
    day_of_id,
    default_name,
    first_id,
    from_bounds,
    partition_name,
)

UTC = datetime.UTC
DAY = datetime.timedelta(days=1)
HOUR = 3600.0
TODAY = datetime.date(2025, 6, 15)
NOW = datetime.datetime(2025, 6, 15, 12, 0, tzinfo=UTC)
ENDED_BY = 86400.0 + 300.0  # the default retry ceiling and breaker.open_for
POLICY = PartitionPolicy(days_ahead=7, delivered=7 * 86400.0, dead=30 * 86400.0, ended_by=ENDED_BY,
                         attempts=30 * 86400.0, events=90 * 86400.0)
LEGACY_UNTIL = {DELIVERIES: datetime.datetime(2025, 5, 1, 9, 30, tzinfo=UTC),
                ATTEMPTS: datetime.datetime(2025, 5, 1, 9, 30, tzinfo=UTC),
                EVENTS: datetime.datetime(2025, 5, 1, 9, 30, tzinfo=UTC)}


def day(table: str, days_ago: int, **facts: object) -> Partition:
    when = TODAY - days_ago * DAY
    return Partition(table, partition_name(table, when), Kind.DAY, when, **facts)  # type: ignore[arg-type]


def at(day_: datetime.date, seconds: float = 0.0) -> datetime.datetime:
    """``seconds`` after the end of ``day_`` (its last row's newest possible instant)."""
    return datetime.datetime.combine(day_ + DAY, datetime.time(), UTC) + datetime.timedelta(seconds=seconds)


# ---------------------------------------------------------------- ids


def test_ids_encode_their_day_and_legacy_ids_are_day_zero() -> None:
    assert first_id(datetime.date(2020, 1, 1)) == 0
    assert first_id(datetime.date(2020, 1, 2)) == LEGACY_ID_END == 2 ** 38
    assert day_of_id(first_id(TODAY)) == TODAY
    assert day_of_id(first_id(TODAY + DAY) - 1) == TODAY
    assert day_of_id(12345) == datetime.date(2020, 1, 1)  # a plain sequence value from before the swap
    assert first_id(TODAY) < first_id(TODAY + DAY)


def test_partition_names() -> None:
    assert partition_name(DELIVERIES, TODAY) == "webhook_deliveries_p20250615"
    assert before_name(EVENTS) == "events_before"
    assert default_name(ATTEMPTS) == "webhook_delivery_attempts_default"


# ---------------------------------------------------------------- what a partition is, by its bounds


@pytest.mark.parametrize(("table", "lower", "upper", "is_default", "kind", "expected_day"), [
    (DELIVERIES, first_id(TODAY), first_id(TODAY + DAY), False, Kind.DAY, TODAY),
    (ATTEMPTS, first_id(TODAY), first_id(TODAY + DAY), False, Kind.DAY, TODAY),
    (EVENTS, TODAY, TODAY + DAY, False, Kind.DAY, TODAY),
    (DELIVERIES, None, LEGACY_ID_END, False, Kind.BEFORE, None),
    (EVENTS, None, EVENTS_LEGACY_END, False, Kind.BEFORE, None),
    (DELIVERIES, None, None, True, Kind.DEFAULT, None),
    (EVENTS, None, None, True, Kind.DEFAULT, None),
    (DELIVERIES, first_id(TODAY), first_id(TODAY + 2 * DAY), False, Kind.OTHER, None),  # two days
    (DELIVERIES, first_id(TODAY) + 1, first_id(TODAY + DAY) + 1, False, Kind.OTHER, None),  # not aligned
    (DELIVERIES, None, first_id(TODAY), False, Kind.OTHER, None),  # MINVALUE to a later day
    (EVENTS, TODAY, TODAY + 2 * DAY, False, Kind.OTHER, None),
    (EVENTS, None, TODAY, False, Kind.OTHER, None),
])
def test_the_kind_follows_from_the_bounds(table: str, lower: object, upper: object, is_default: bool,
                                          kind: Kind, expected_day: datetime.date | None) -> None:
    found = from_bounds(table, "whatever_name", lower, upper, is_default)  # type: ignore[arg-type]
    assert (found.kind, found.day) == (kind, expected_day)


# ---------------------------------------------------------------- created ahead


def test_every_table_gets_today_and_days_ahead_todays_first() -> None:
    missing = POLICY.missing(TODAY, [])
    assert missing[:3] == [(table, TODAY) for table in TABLES]
    assert len(missing) == 3 * 8 and missing[-1] == (EVENTS, TODAY + 7 * DAY)


def test_existing_partitions_are_not_created_again_and_old_ones_do_not_count() -> None:
    have = [day(table, -n) for table in TABLES for n in range(6)] + [day(DELIVERIES, 3)]
    assert POLICY.missing(TODAY, have) == [(table, TODAY + n * DAY) for n in (6, 7) for table in TABLES]
    assert POLICY.missing(TODAY, have + [day(t, -n) for t in TABLES for n in (6, 7)]) == []


def test_before_default_and_foreign_partitions_never_stand_for_a_day() -> None:
    others = [Partition(DELIVERIES, "x", kind) for kind in (Kind.BEFORE, Kind.DEFAULT, Kind.OTHER)]
    assert (DELIVERIES, TODAY) in POLICY.missing(TODAY, others)


def test_days_ahead_count_from_tomorrow_without_a_gap() -> None:
    have = [day(DELIVERIES, -n) for n in (0, 1, 2, 3)] + [day(ATTEMPTS, -n) for n in (1, 2, 4)]
    assert ahead_days(TODAY, have) == {DELIVERIES: 3, ATTEMPTS: 2, EVENTS: 0}
    assert ahead_days(TODAY, [day(EVENTS, -n) for n in range(1, 8)])[EVENTS] == 7
    # today's own partition is no day ahead, and a missing today does not hide the days after it
    assert ahead_days(TODAY, [day(EVENTS, -1)])[EVENTS] == 1


def test_the_plan_creates_what_is_missing_and_reports_days_ahead() -> None:
    plan = POLICY.plan(NOW, [day(t, -n) for t in TABLES for n in range(5)], {})
    assert plan.create == tuple((t, TODAY + n * DAY) for n in (5, 6, 7) for t in TABLES)
    assert plan.ahead == {t: 4 for t in TABLES}


def test_the_clock_decides_today_in_utc() -> None:
    late_evening_west = datetime.datetime(2025, 6, 14, 21, 0, tzinfo=datetime.timezone(-datetime.timedelta(hours=5)))
    assert POLICY.plan(late_evening_west, [], {}).create[0] == (DELIVERIES, TODAY)  # 02:00 UTC on the 15th


# ---------------------------------------------------------------- dropped, kept or waiting: deliveries

D = TODAY - 10 * DAY  # a deliveries day ten days back
WEEK, MONTH = 7 * 86400.0, 30 * 86400.0


@pytest.mark.parametrize(("case", "facts", "now", "action", "reason"), [
    ("inside retention.delivered", {}, at(D, WEEK - 1), Action.KEEP, "inside retention.delivered"),
    ("delivered rows only, past retention.delivered: dropped", {}, at(D, WEEK), Action.DROP, "past its retention"),
    ("a dead or failed row: kept through retention.dead and the retry window",
     {"ended_rows": True}, at(D, WEEK), Action.KEEP, "dead or failed rows inside retention.dead"),
    ("a dead or failed row: kept until the last second", {"ended_rows": True}, at(D, MONTH + ENDED_BY - 1),
     Action.KEEP, "retention.dead"),
    ("a dead or failed row past retention.dead + ended_by: dropped", {"ended_rows": True},
     at(D, MONTH + ENDED_BY), Action.DROP, "past its retention"),
    ("a pending (or leased) or held row past retention: waits", {"open_rows": True}, at(D, WEEK),
     Action.WAIT, "pending or held rows"),
    ("a pending row waits however old", {"open_rows": True, "ended_rows": True}, at(D, 10 * MONTH),
     Action.WAIT, "pending or held"),
    ("a pending row inside retention: kept, not waiting", {"open_rows": True}, at(D, HOUR), Action.KEEP,
     "retention.delivered"),
])
def test_deliveries_day_partitions(case: str, facts: dict[str, bool], now: datetime.datetime, action: Action,
                                   reason: str) -> None:
    partition = Partition(DELIVERIES, partition_name(DELIVERIES, D), Kind.DAY, D, **facts)  # type: ignore[arg-type]
    decision = POLICY.decide(partition, now, LEGACY_UNTIL)
    assert (decision.action, decision.partition) == (action, partition), case
    assert reason in decision.reason, (case, decision.reason)


def test_a_longer_delivered_retention_than_dead_one_rules_rows_that_ended_too() -> None:
    policy = PartitionPolicy(delivered=60 * 86400.0, dead=86400.0, ended_by=ENDED_BY)
    partition = day(DELIVERIES, 10, ended_rows=True)
    assert policy.decide(partition, at(partition.day, 59 * 86400.0), {}).action is Action.KEEP  # type: ignore[arg-type]
    decision = policy.decide(partition, at(partition.day, 60 * 86400.0), {})  # type: ignore[arg-type]
    assert decision.action is Action.DROP


def test_the_reasons_name_when_a_partition_went_past_retention() -> None:
    decision = POLICY.decide(Partition(DELIVERIES, "p", Kind.DAY, D, open_rows=True), at(D, 2 * WEEK), {})
    assert "since 2025-06-13 00:00 UTC" in decision.reason  # D + 1 day + 7 days


# ---------------------------------------------------------------- attempts and events


@pytest.mark.parametrize(("table", "facts", "after_end", "action"), [
    (ATTEMPTS, {}, MONTH - 1, Action.KEEP),
    (ATTEMPTS, {}, MONTH, Action.DROP),
    (EVENTS, {"referenced": False}, 90 * 86400.0 - 1, Action.KEEP),
    (EVENTS, {"referenced": False}, 90 * 86400.0, Action.DROP),
    (EVENTS, {"referenced": True}, 90 * 86400.0, Action.WAIT),
    (EVENTS, {"referenced": True}, 400 * 86400.0, Action.WAIT),
    (EVENTS, {}, 90 * 86400.0, Action.WAIT),  # not probed: never dropped on a guess
])
def test_attempts_and_events_day_partitions(table: str, facts: dict[str, bool], after_end: float,
                                            action: Action) -> None:
    partition = Partition(table, partition_name(table, D), Kind.DAY, D, **facts)  # type: ignore[arg-type]
    assert POLICY.decide(partition, at(D, after_end), LEGACY_UNTIL).action is action


def test_an_events_partition_waits_for_the_deliveries_that_refer_to_it() -> None:
    decision = POLICY.decide(Partition(EVENTS, "e", Kind.DAY, D, referenced=True), at(D, 100 * 86400.0), {})
    assert decision.action is Action.WAIT and "delivery rows still refer to its events" in decision.reason


def test_only_events_partitions_past_retention_are_worth_probing() -> None:
    young, old = day(EVENTS, 89), day(EVENTS, 91)
    assert not POLICY.past_retention(young, NOW, {}) and POLICY.past_retention(old, NOW, {})
    assert POLICY.past_retention(Partition(EVENTS, "events_before", Kind.BEFORE),
                                 LEGACY_UNTIL[EVENTS] + datetime.timedelta(days=90), LEGACY_UNTIL)
    assert not POLICY.past_retention(Partition(EVENTS, "events_default", Kind.DEFAULT), NOW, LEGACY_UNTIL)


# ---------------------------------------------------------------- *_before, DEFAULT, foreign partitions


@pytest.mark.parametrize(("table", "facts", "after", "action"), [
    (DELIVERIES, {}, WEEK - 1, Action.KEEP),
    (DELIVERIES, {}, WEEK, Action.DROP),
    (DELIVERIES, {"ended_rows": True}, WEEK, Action.KEEP),
    (DELIVERIES, {"ended_rows": True}, MONTH + ENDED_BY, Action.DROP),
    (DELIVERIES, {"open_rows": True}, 5 * MONTH, Action.WAIT),
    (ATTEMPTS, {}, MONTH - 1, Action.KEEP),
    (ATTEMPTS, {}, MONTH, Action.DROP),
    (EVENTS, {"referenced": True}, 90 * 86400.0, Action.WAIT),
    (EVENTS, {"referenced": False}, 90 * 86400.0, Action.DROP),
])
def test_before_partitions_count_from_legacy_until(table: str, facts: dict[str, bool], after: float,
                                                  action: Action) -> None:
    """The legacy rows' ids and days say nothing of their age: their newest is when the table stopped taking
    rows (partitioning.legacy_until)."""
    partition = Partition(table, before_name(table), Kind.BEFORE, **facts)  # type: ignore[arg-type]
    now = LEGACY_UNTIL[table] + datetime.timedelta(seconds=after)
    assert POLICY.decide(partition, now, LEGACY_UNTIL).action is action


def test_a_before_partition_without_legacy_until_waits_and_says_why() -> None:
    decision = POLICY.decide(Partition(DELIVERIES, "webhook_deliveries_before", Kind.BEFORE),
                             NOW + 1000 * DAY, {})
    assert decision.action is Action.WAIT and "legacy_until" in decision.reason


@pytest.mark.parametrize("kind", [Kind.DEFAULT, Kind.OTHER])
@pytest.mark.parametrize("table", TABLES)
def test_default_and_foreign_partitions_are_never_dropped(kind: Kind, table: str) -> None:
    partition = Partition(table, "x", kind, referenced=False)
    decision = POLICY.decide(partition, NOW + 10_000 * DAY, LEGACY_UNTIL)
    assert decision.action is Action.KEEP and decision.reason


def test_the_plan_sorts_every_partition_into_one_list() -> None:
    found = [day(DELIVERIES, 30), day(DELIVERIES, 40, open_rows=True), day(DELIVERIES, 1), day(ATTEMPTS, 40),
             day(EVENTS, 100, referenced=True), day(EVENTS, 101, referenced=False),
             Partition(DELIVERIES, default_name(DELIVERIES), Kind.DEFAULT)]
    plan = POLICY.plan(NOW, found, LEGACY_UNTIL)
    assert [d.partition for d in plan.drop] == [found[0], found[3], found[5]]
    assert [d.partition for d in plan.wait] == [found[1], found[4]]
    assert [d.partition for d in plan.keep] == [found[2], found[6]]


# ---------------------------------------------------------------- settings


def test_the_policy_takes_its_settings_from_the_config() -> None:
    config = config_from_mapping({"partitions": {"days_ahead": 3},
                                  "retention": {"delivered": "2d", "dead": "10d", "attempts": "5d", "events": "60d"},
                                  "retry": {"ceiling": "12h", "policies": {"slow": {"ceiling": "48h"}}},
                                  "breaker": {"open_for": "10m"}}, env={})
    assert config.partition_policy() == PartitionPolicy(days_ahead=3, delivered=2 * 86400.0, dead=10 * 86400.0,
                                                        ended_by=48 * HOUR + 600.0, attempts=5 * 86400.0,
                                                        events=60 * 86400.0)
    default = config_from_mapping({}, env={})
    assert (default.partitions.days_ahead, default.retention.events) == (7, 90 * 86400.0)
    assert default.partition_policy() == POLICY


@pytest.mark.parametrize("bad", [{"days_ahead": 0}, {"delivered": -1.0}, {"events": float("inf")}])
def test_a_policy_out_of_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PartitionPolicy(**bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- dispatcher check: too few days ahead


def test_check_warns_when_a_table_has_fewer_than_two_days_ahead() -> None:
    healthy_backlog = BacklogFigures(overdue_rows=0, oldest_age=None, held_rows=0, open_breakers=0)
    healthy_fleet = FleetFigures(heartbeat_age=1.0, workers_alive=1, leader_age=1.0)
    ok = judge(healthy_backlog, healthy_fleet, BacklogRule(), FleetRule(), {t: 2 for t in TABLES})
    assert ok == Verdict(Severity.OK, ())
    short = judge(healthy_backlog, healthy_fleet, BacklogRule(), FleetRule(), {DELIVERIES: 7, ATTEMPTS: 1, EVENTS: 0})
    assert short.severity is Severity.WARNING
    assert [p.split(" ", 1)[0] for p in short.problems] == [EVENTS, ATTEMPTS]
    assert "DEFAULT partition" in short.problems[0]
    backlog = BacklogFigures(overdue_rows=10**6, oldest_age=10**6, held_rows=0, open_breakers=0)
    assert judge(backlog, healthy_fleet, BacklogRule(), FleetRule(), {EVENTS: 0}).severity is Severity.CRITICAL
    assert partition_breaches({}) == [] and partition_breaches({EVENTS: PARTITION_DAYS_AHEAD}) == []
