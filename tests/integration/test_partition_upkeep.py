"""Retention by dropping whole partitions, and partitions created ahead (issue 25): the upkeep leader
against a real Postgres.  Rows are aged by their ids, never by sleeping: a row of a past day gets an id of
that day (dispatcher_first_id) and that day gets its partition (dispatcher_create_partition)."""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import psycopg2
import pytest

from dispatcher.cli.main import main
from dispatcher.config import Config, config_from_mapping
from dispatcher.engine.upkeep import Upkeep
from dispatcher.metrics import Metrics
from dispatcher.rules.partitions import (
    ATTEMPTS,
    DELIVERIES,
    EVENTS,
    TABLES,
    Action,
    day_of_id,
    first_id,
    partition_name,
)
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher.store.partitions import PartitionStore
from dispatcher_devtools.kit import produce, query, seed_workspace

DAY = datetime.timedelta(days=1)


class Gauges(Metrics):
    """Metrics that keep the leader's gauges instead of sending them."""

    def __init__(self, config: Config) -> None:
        super().__init__(config.statsd)
        self.last: dict[str, float] = {}

    def gauges(self, values: Iterable[tuple[str, float]]) -> None:
        self.last.update(values)


def make_config(dsn: str, **retention: str) -> Config:
    return config_from_mapping({"region": "test", "database": {"dsn": dsn}, "statsd": {"enabled": False},
                                "retention": retention}, env={})


def leader(dsn: str, config: Config | None = None) -> tuple[Upkeep, Gauges]:
    config = config or make_config(dsn)
    metrics = Gauges(config)
    return Upkeep(config, EngineStore(ManagedConnection(dsn, "test")), metrics), metrics


def run_upkeep(dsn: str, config: Config | None = None) -> Gauges:
    """One round of a new leader."""
    upkeep, metrics = leader(dsn, config)
    upkeep.run_once()
    return metrics


def today(dsn: str) -> datetime.date:
    return query(dsn, "SELECT dispatcher_today()")[0][0]


def partitions(dsn: str, parent: str) -> set[str]:
    return {row[0] for row in query(dsn, "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                                         "WHERE i.inhparent = %s::regclass", (parent,))}


def exists(dsn: str, name: str) -> bool:
    return bool(query(dsn, "SELECT to_regclass(%s) IS NOT NULL", (name,))[0][0])


def make_day(dsn: str, table: str, day: datetime.date) -> str:
    query(dsn, "SELECT dispatcher_create_partition(%s, %s)", (table, day))
    return partition_name(table, day)


def delivery(dsn: str, endpoint: int, day: datetime.date, status: str, n: int = 1,
             event_day: datetime.date | None = None) -> int:
    """A delivery row of ``day`` (id, created_at and event_day of that day unless told)."""
    row_id = first_id(day) + n
    query(dsn, "INSERT INTO webhook_deliveries (id, workspace_id, endpoint_id, event_id, payload_hash, status, mode, "
               "created_at, event_day) VALUES (%s, 'ws', %s, %s, 'h', %s, %s, %s::date + time '12:00', %s)",
          (row_id, endpoint, f"ev-{day}-{n}", status, "shadow" if status == "shadow" else "live", day,
           event_day or day))
    return row_id


def event(dsn: str, day: datetime.date, n: int = 1) -> None:
    query(dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload, created_at, day) "
               "VALUES (%s, 'ws', 't', %s, '{}', %s::date + time '12:00', %s)", (f"ev-{day}-{n}", n, day, day))


@pytest.fixture
def endpoint(db) -> int:
    (endpoint_id,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    return endpoint_id


@contextmanager
def holding(dsn: str, table: str) -> Iterator[None]:
    """Another session holds a lock on ``table`` (ACCESS SHARE: any reader's), as a long transaction would."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"LOCK TABLE {table} IN ACCESS SHARE MODE")
            yield
    finally:
        conn.rollback()
        conn.close()


# ---------------------------------------------------------------- dropped whole


def test_a_partition_of_delivered_rows_past_retention_is_dropped_whole_never_deleted(db, endpoint, caplog) -> None:
    old = today(db.dsn) - 10 * DAY
    name = make_day(db.dsn, DELIVERIES, old)
    for n in range(3):
        delivery(db.dsn, endpoint, old, "delivered", n)
    # Any DELETE of its rows, batched or not, would leave a trace here.
    query(db.dsn, "CREATE TABLE deleted (id bigint);"
                  "CREATE FUNCTION log_delete() RETURNS trigger LANGUAGE plpgsql AS "
                  "$$ BEGIN INSERT INTO deleted VALUES (OLD.id); RETURN OLD; END $$;"
                  f"CREATE TRIGGER log_delete BEFORE DELETE ON {name} FOR EACH ROW EXECUTE FUNCTION log_delete()")
    young = delivery(db.dsn, endpoint, today(db.dsn), "delivered")

    with caplog.at_level(logging.INFO, logger="dispatcher.upkeep"):
        gauges = run_upkeep(db.dsn)

    assert not exists(db.dsn, name) and name not in partitions(db.dsn, DELIVERIES)
    assert query(db.dsn, "SELECT count(*) FROM deleted") == [(0,)]
    assert query(db.dsn, "SELECT id FROM webhook_deliveries") == [(young,)]
    assert any(f"dropped {name}" in r.getMessage() for r in caplog.records)
    assert gauges.last["webhook_partitions_waiting"] == 0


def test_attempt_history_goes_by_its_own_retention(db, endpoint) -> None:
    base = today(db.dsn)
    kept, dropped = make_day(db.dsn, ATTEMPTS, base - 29 * DAY), make_day(db.dsn, ATTEMPTS, base - 31 * DAY)
    run_upkeep(db.dsn)
    assert exists(db.dsn, kept) and not exists(db.dsn, dropped)


# ---------------------------------------------------------------- waits


@pytest.mark.parametrize(("status", "action"), [
    ("pending", Action.WAIT), ("held", Action.WAIT),
    ("dead", Action.KEEP),  # dead 10 days ago: inside retention.dead, kept (not a wait: the retention rule)
    ("failed", Action.KEEP),
])
def test_a_partition_with_an_unfinished_or_recent_dead_row_stays(status: str, action: Action, db, endpoint,
                                                                  caplog) -> None:
    old = today(db.dsn) - 10 * DAY
    name = make_day(db.dsn, DELIVERIES, old)
    delivery(db.dsn, endpoint, old, "delivered", 1)
    kept = delivery(db.dsn, endpoint, old, status, 2)

    upkeep, gauges = leader(db.dsn)
    with caplog.at_level(logging.INFO, logger="dispatcher.upkeep"):
        upkeep.run_once()
        upkeep.run_once()

    assert exists(db.dsn, name) and kept in {row[0] for row in query(db.dsn, "SELECT id FROM webhook_deliveries")}
    waiting = 1 if action is Action.WAIT else 0
    assert gauges.last["webhook_partitions_waiting"] == waiting
    said = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(said) == waiting, said  # once, not every round
    if waiting:
        assert "waits: holds pending or held rows" in said[0]


@pytest.mark.parametrize(("status", "kept"), [("pending", True), ("held", True), ("dead", False),
                                            ("delivered", False)])
def test_the_database_checks_the_waiting_rule_again_under_the_lock(status: str, kept: bool, db, endpoint) -> None:
    """The SQL twin of the waiting rule (dispatcher_drop_partition): asked to drop a partition that holds a
    pending or held row (by a policy that looked before the row was written), the database keeps it and says
    why; what the policy may drop for its age alone, it drops."""
    old = today(db.dsn) - 10 * DAY
    name = make_day(db.dsn, DELIVERIES, old)
    delivery(db.dsn, endpoint, old, status)
    store = PartitionStore(ManagedConnection(db.dsn, "test"))
    (found,) = [p for p in store.listing().partitions if p.name == name]
    assert (found.open_rows, found.ended_rows) == (kept, status == "dead")
    outcome = store.drop(found, lock_timeout=0.2)
    assert (outcome.done, outcome.retry) == (not kept, False)
    assert (name in partitions(db.dsn, DELIVERIES)) == kept
    if kept:
        assert "pending or held" in outcome.detail


def test_the_database_keeps_an_events_partition_a_delivery_refers_to(db, endpoint) -> None:
    old = today(db.dsn) - 100 * DAY
    name = make_day(db.dsn, EVENTS, old)
    event(db.dsn, old)
    replay = delivery(db.dsn, endpoint, today(db.dsn), "pending", event_day=old)
    store = PartitionStore(ManagedConnection(db.dsn, "test"))
    (found,) = [p for p in store.listing().partitions if p.name == name]
    assert store.events_referenced(found)
    outcome = store.drop(found, lock_timeout=0.2)
    assert not outcome.done and "delivery rows still refer to its events" in outcome.detail
    query(db.dsn, "UPDATE webhook_deliveries SET event_day = dispatcher_today() WHERE id = %s", (replay,))
    assert not store.events_referenced(found) and store.drop(found, lock_timeout=0.2).done
    assert not exists(db.dsn, name)


def test_the_listings_facts_are_the_partitions_own(db, endpoint) -> None:
    base = today(db.dsn)
    for n, status in enumerate(("pending", "held", "dead", "failed", "delivered", "shadow")):
        make_day(db.dsn, DELIVERIES, base - (n + 1) * DAY)
        delivery(db.dsn, endpoint, base - (n + 1) * DAY, status)
    facts = {p.day: (p.open_rows, p.ended_rows)
             for p in PartitionStore(ManagedConnection(db.dsn, "test")).listing().partitions
             if p.table == DELIVERIES and p.day is not None and p.day < base}
    assert facts == {base - 1 * DAY: (True, False), base - 2 * DAY: (True, False), base - 3 * DAY: (False, True),
                     base - 4 * DAY: (False, True), base - 5 * DAY: (False, False), base - 6 * DAY: (False, False)}


# ---------------------------------------------------------------- events


def test_events_past_retention_go_only_once_no_delivery_refers_to_them(db, endpoint, caplog) -> None:
    base = today(db.dsn)
    referred, alone, young = base - 100 * DAY, base - 95 * DAY, base - 80 * DAY
    for day in (referred, alone, young):
        make_day(db.dsn, EVENTS, day)
        event(db.dsn, day)
    # A replay made today of an old event: today's row, the old event's day.
    replay = delivery(db.dsn, endpoint, base, "delivered", event_day=referred)

    with caplog.at_level(logging.INFO, logger="dispatcher.upkeep"):
        gauges = run_upkeep(db.dsn)
    assert exists(db.dsn, partition_name(EVENTS, referred)) and exists(db.dsn, partition_name(EVENTS, young))
    assert not exists(db.dsn, partition_name(EVENTS, alone))
    assert gauges.last["webhook_partitions_waiting"] == 1
    assert any("delivery rows still refer to its events" in r.getMessage() for r in caplog.records)

    query(db.dsn, "DELETE FROM webhook_deliveries WHERE id = %s", (replay,))
    assert run_upkeep(db.dsn).last["webhook_partitions_waiting"] == 0
    assert not exists(db.dsn, partition_name(EVENTS, referred)) and exists(db.dsn, partition_name(EVENTS, young))


def test_before_partitions_age_from_legacy_until_and_events_wait_for_their_deliveries(db, endpoint) -> None:
    """The legacy tables, attached as *_before, stopped taking rows at partitioning.legacy_until: 100 days
    ago here.  Their delivered rows and history go whole; their events wait one round more, for the legacy
    deliveries that refer to them (event_day 2000-01-01) to be gone."""
    query(db.dsn, "UPDATE partitioning SET legacy_until = now() - interval '100 days'")
    query(db.dsn, "INSERT INTO webhook_deliveries (id, workspace_id, endpoint_id, event_id, payload_hash, status, "
                  "created_at, event_day) VALUES (5, 'ws', %s, 'legacy', 'h', 'delivered', "
                  "now() - interval '101 days', '2000-01-01')", (endpoint,))
    query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload, created_at, day) "
                  "VALUES ('legacy', 'ws', 't', 1, '{}', now() - interval '101 days', '2000-01-01')")
    befores = [f"{table}_before" for table in TABLES]
    assert all(exists(db.dsn, name) for name in befores)

    first = run_upkeep(db.dsn)
    assert not exists(db.dsn, "webhook_deliveries_before") and not exists(db.dsn, "webhook_delivery_attempts_before")
    assert exists(db.dsn, "events_before") and first.last["webhook_partitions_waiting"] == 1
    run_upkeep(db.dsn)
    assert not exists(db.dsn, "events_before")
    # The sequences outlive the legacy tables: new rows still get ids.
    assert day_of_id(delivery_id(db.dsn, endpoint)) == today(db.dsn)


def delivery_id(dsn: str, endpoint: int) -> int:
    return int(query(dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash) "
                          "VALUES ('ws', %s, 'new', 'h') RETURNING id", (endpoint,))[0][0])


def test_a_before_partition_with_a_pending_row_waits(db, endpoint) -> None:
    query(db.dsn, "UPDATE partitioning SET legacy_until = now() - interval '100 days'")
    query(db.dsn, "INSERT INTO webhook_deliveries (id, workspace_id, endpoint_id, event_id, payload_hash, status, "
                  "event_day) VALUES (7, 'ws', %s, 'legacy', 'h', 'pending', '2000-01-01')", (endpoint,))
    gauges = run_upkeep(db.dsn)
    assert exists(db.dsn, "webhook_deliveries_before") and gauges.last["webhook_partitions_waiting"] >= 1


# ---------------------------------------------------------------- a busy table


def test_a_lock_timeout_is_reported_and_retried_not_raised(db, endpoint, caplog) -> None:
    base = today(db.dsn)
    old = make_day(db.dsn, DELIVERIES, base - 10 * DAY)
    delivery(db.dsn, endpoint, base - 10 * DAY, "delivered")
    query(db.dsn, "SELECT dispatcher_drop_partition(%s, %s)", (DELIVERIES, partition_name(DELIVERIES, base + 7 * DAY)))
    future = partition_name(DELIVERIES, base + 7 * DAY)

    with holding(db.dsn, DELIVERIES), caplog.at_level(logging.INFO, logger="dispatcher.upkeep"):
        gauges = run_upkeep(db.dsn)  # neither the CREATE nor the DETACH gets its lock: no exception
    assert exists(db.dsn, old) and not exists(db.dsn, future)
    assert gauges.last["webhook_partitions_ahead_days"] == 6
    busy = [r.getMessage() for r in caplog.records if "stayed busy past partitions.lock_timeout" in r.getMessage()]
    assert busy and all("tried again next round" in message for message in busy)

    gauges = run_upkeep(db.dsn)
    assert not exists(db.dsn, old) and exists(db.dsn, future)
    assert gauges.last["webhook_partitions_ahead_days"] == 7


# ---------------------------------------------------------------- created ahead, and the DEFAULT partitions


def test_the_upkeep_creates_the_days_ahead(db) -> None:
    base = today(db.dsn)
    for table in TABLES:
        for n in range(3, 8):
            query(db.dsn, "SELECT dispatcher_drop_partition(%s, %s)", (table, partition_name(table, base + n * DAY)))
    config = config_from_mapping({"region": "test", "database": {"dsn": db.dsn}, "statsd": {"enabled": False},
                                  "partitions": {"days_ahead": 9}}, env={})
    gauges = run_upkeep(db.dsn, config)
    for table in TABLES:
        assert {partition_name(table, base + n * DAY) for n in range(10)} <= partitions(db.dsn, table)
    assert gauges.last["webhook_partitions_ahead_days"] == 9


def test_a_producer_never_fails_for_want_of_a_partition(db, write_config, caplog) -> None:
    """Today's partitions gone (the upkeep down for a week, say): the rows go to the DEFAULT partitions.
    The upkeep then cannot create today's (the DEFAULT holds rows of it) and says so, once; it still
    creates the days after, and those rows are pruned row by row once past retention."""
    seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    base = today(db.dsn)
    for table in TABLES:
        query(db.dsn, "SELECT dispatcher_drop_partition(%s, %s)", (table, partition_name(table, base)))
        query(db.dsn, "SELECT dispatcher_drop_partition(%s, %s)", (table, partition_name(table, base + 7 * DAY)))
    ids = produce(write_config(db), db.dsn, "ws", 3)
    assert len(ids) == 3
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries_default") == [(3,)]
    assert query(db.dsn, "SELECT count(*) FROM events_default") == [(3,)]

    upkeep, _ = leader(db.dsn)
    with caplog.at_level(logging.WARNING, logger="dispatcher.upkeep"):
        upkeep.run_once()
        upkeep.run_once()
    refused = [r.getMessage() for r in caplog.records if "DEFAULT partition holds rows of that day" in r.getMessage()]
    assert len(refused) == 2, refused  # deliveries' and events' today, each said once
    for table in TABLES:
        assert exists(db.dsn, partition_name(table, base + 7 * DAY))
    assert not exists(db.dsn, partition_name(DELIVERIES, base))


def test_check_and_status_warn_when_fewer_than_two_days_are_ahead(db, endpoint, write_config, capsys) -> None:
    base = today(db.dsn)
    query(db.dsn, "INSERT INTO dispatcher_processes (owner, region, host, pid, started_at, leader_at) "
                  "VALUES ('h:1:w1', 'test', 'h', 1, now(), now())")  # a healthy fleet: the verdict is ours
    path = str(write_config(db))
    assert main(["-c", path, "check"]) == 0
    capsys.readouterr()
    for n in range(2, 8):
        query(db.dsn, "SELECT dispatcher_drop_partition('events', %s)", (partition_name(EVENTS, base + n * DAY),))

    assert main(["-c", path, "check"]) == 1
    line = capsys.readouterr().out
    assert line.startswith("WARNING - events has partitions for 1 days ahead only (fewer than 2)"), line
    assert "partitions_ahead_days=1" in line
    assert main(["-c", path, "check", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["partitions"]["days_ahead"] == {DELIVERIES: 7, ATTEMPTS: 7, EVENTS: 1}
    assert main(["-c", path, "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["partitions"]["days_ahead"][EVENTS] == 1 and status["health"]["status"] == "WARNING"
    assert main(["-c", path, "status"]) == 0
    assert "partitions days ahead: events 1" in capsys.readouterr().out

    run_upkeep(db.dsn)  # the leader creates them again
    assert main(["-c", path, "check"]) == 0
