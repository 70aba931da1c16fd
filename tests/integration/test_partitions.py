"""The outbox partitioned by day (migrations 0025-0027) against a real Postgres.

The id rule's SQL functions and their Python twins (dispatcher/rules/partitions.py)
agree on the same cases; the partitions the migrations made are where they should be;
a row of a day without a partition is still delivered; the producer refuses a resend
the same day and the next; and a database with rows written before 0025 migrates
without losing a row, an id or a lease.
"""

from __future__ import annotations

import time
from datetime import date

import pytest

from dispatcher.rules import partitions
from dispatcher.store.deliveries import get_delivery
from dispatcher.store.engine import AttemptRecord, ClaimedRow, EngineStore, ManagedConnection
from dispatcher.store.queries import QUERIES
from dispatcher_devtools.kit import seed_workspace
from tests.conftest import TestDatabase as Database
from tests.support.partitions import partitions_read

DAYS = [date(2020, 1, 1), date(2020, 1, 2), date(2024, 2, 29), date(2026, 1, 31), date(2026, 12, 31),
        date(2099, 12, 31), date(2019, 12, 31)]
IDS = [0, 1, 2**38 - 1, 2**38, 2**38 + 1, 5 * 2**38 + 12345, partitions.first_id(date(9999, 12, 31)) + 2**38 - 1]


@pytest.mark.parametrize("day", DAYS)
def test_first_id_and_partition_name_agree_with_sql(db: Database, day: date) -> None:
    got = db.query("SELECT dispatcher_first_id(%s), dispatcher_partition_name('webhook_deliveries', %s), "
                   "dispatcher_day_of_id(dispatcher_first_id(%s))", (day, day, day))
    assert got == [(partitions.first_id(day), partitions.partition_name("webhook_deliveries", day), day)]


@pytest.mark.parametrize("id_", IDS)
def test_day_of_id_agrees_with_sql(db: Database, id_: int) -> None:
    assert db.query("SELECT dispatcher_day_of_id(%s)", (id_,)) == [(partitions.day_of_id(id_),)]


def test_the_migration_made_today_and_the_next_seven_days(db: Database) -> None:
    (today,), = db.query("SELECT dispatcher_today()")
    for table in partitions.TABLES:
        found = {name for name, in db.query(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass", (table,))}
        days = {partitions.partition_name(table, date.fromordinal(today.toordinal() + n)) for n in range(8)}
        assert days | {f"{table}_before", f"{table}_default"} <= found, table


def test_ensure_partitions_creates_only_what_is_missing(db: Database) -> None:
    (today,), = db.query("SELECT dispatcher_today()")
    created = [name for name, in db.query("SELECT dispatcher_ensure_partitions(9)")]
    assert created == [partitions.partition_name(table, date.fromordinal(today.toordinal() + n))
                       for table in partitions.TABLES for n in (8, 9)]
    assert db.query("SELECT dispatcher_ensure_partitions(9)") == []
    # Each deliveries partition keeps half of each page free for the lease's HOT updates.
    options = db.query("SELECT c.reloptions FROM pg_class c WHERE c.relname = %s",
                       (partitions.partition_name("webhook_deliveries", today),))
    assert options == [(["fillfactor=50"],)]


def test_new_ids_are_today_s(db: Database) -> None:
    (today,), = db.query("SELECT dispatcher_today()")
    (id_,), = db.query("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash) "
                       "VALUES ('w', 1, 'e', 'h') RETURNING id")
    assert partitions.day_of_id(id_) == today
    assert db.query("SELECT tableoid::regclass::text, event_day FROM webhook_deliveries WHERE id = %s", (id_,)) == [
        (partitions.partition_name("webhook_deliveries", today), today)]


# ---------------------------------------------------------------- helpers

SEND = ("SELECT mode, deliveries FROM dispatcher_send_event(%s, %s, 'job.created', NULL, '{\"n\": 1}'::jsonb, 'h', "
        "false, 0)")


def _today(db: Database) -> date:
    (today,), = db.query("SELECT dispatcher_today()")
    return today


def _store(db: Database) -> EngineStore:
    return EngineStore(ManagedConnection(db.dsn, "test"))


def _attach_day(db: Database, table: str, day: date) -> None:
    db.query(f"CREATE TABLE {partitions.partition_name(table, day)} PARTITION OF {table} "
             "FOR VALUES FROM (%s) TO (%s)", (partitions.first_id(day), partitions.first_id(day) + 2**38))


def _attempts_read(db: Database, ids: list[int]) -> set[str]:
    """The attempts partitions the API's attempts query reads for ``ids``, as the store passes them."""
    plan = db.query("EXPLAIN (COSTS OFF) " + QUERIES["api_delivery_attempts"],
                    {"ids": ids, "first": min(ids), "last": None})
    return partitions_read("\n".join(row[0] for row in plan), "webhook_delivery_attempts")


def _delivered(row: ClaimedRow) -> AttemptRecord:
    return AttemptRecord(row.id, row.claim_token, row.endpoint_id, "delivered", row.attempt, 0.0, None, 200,
                         "delivered", time.monotonic(), 5, "ok")


# ---------------------------------------------------------------- DEFAULT


def test_a_row_of_a_day_without_a_partition_lands_in_default_and_is_still_claimed_and_delivered(
        db: Database) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    # Three days ago has no partition (the upkeep was down): the row is written to DEFAULT.
    day = date.fromordinal(_today(db).toordinal() - 3)
    db.query("INSERT INTO events (id, workspace_id, type, sequence, payload, day) VALUES ('e', 'ws', 't', 1, '{}', %s)",
             (day,))
    (id_,), = db.query("INSERT INTO webhook_deliveries (id, workspace_id, endpoint_id, event_id, payload_hash, "
                       "event_day) VALUES (%s, 'ws', %s, 'e', 'h', %s) RETURNING id",
                       (partitions.first_id(day) + 7, endpoint, day))
    assert db.query("SELECT tableoid::regclass::text FROM webhook_deliveries WHERE id = %s", (id_,)) == [
        ("webhook_deliveries_default",)]
    assert db.query("SELECT tableoid::regclass::text FROM events WHERE id = 'e'") == [("events_default",)]
    store = _store(db)
    window = store.claim_window()
    assert window.floor == id_, "the window reaches down to DEFAULT's pending row"
    (row,) = store.claim("w", 10, 4, [], 0, 30.0, window=window)
    assert (row.id, row.event_type, row.payload) == (id_, "t", "{}")
    assert store.record([_delivered(row)]) == {id_}
    assert db.query("SELECT status FROM webhook_deliveries WHERE id = %s", (id_,)) == [("delivered",)]
    assert store.claim_window().floor == partitions.first_id(_today(db)), "nothing pending left: today's"


def test_the_window_skips_older_partitions_until_a_row_there_is_due(db: Database) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    today = _today(db)
    old = date.fromordinal(today.toordinal() - 2)
    _attach_day(db, "webhook_deliveries", old)
    (id_,), = db.query("INSERT INTO webhook_deliveries (id, workspace_id, endpoint_id, event_id, payload_hash, "
                       "next_attempt_at) VALUES (%s, 'ws', %s, 'e', 'h', now() + interval '1 hour') RETURNING id",
                       (partitions.first_id(old) + 1, endpoint))
    store = _store(db)
    assert store.claim_window().floor == partitions.first_id(today), "its retry is an hour away"
    db.query("UPDATE webhook_deliveries SET next_attempt_at = now() + interval '30 seconds' WHERE id = %s", (id_,))
    assert store.claim_window().floor == partitions.first_id(old), "due within a minute: in the window"


# ---------------------------------------------------------------- deduplication


def test_a_resend_is_refused_the_same_day_and_the_next(db: Database) -> None:
    seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    today = _today(db)
    yesterday = date.fromordinal(today.toordinal() - 1)
    assert db.query(SEND, ("ws", "evt_1")) == [("live", 1)]
    assert db.query(SEND, ("ws", "evt_1")) == [("duplicate", 0)], "the same day: the key"
    # As if evt_1 had been sent yesterday (its row moves to yesterday's partition).
    db.query(f"CREATE TABLE {partitions.partition_name('events', yesterday)} PARTITION OF events "
             "FOR VALUES FROM (%s) TO (%s)", (yesterday, today))
    db.query("UPDATE events SET day = %s WHERE id = 'evt_1'", (yesterday,))
    assert db.query(SEND, ("ws", "evt_1")) == [("duplicate", 0)], "the next day: a look into yesterday's partition"
    # Two days old: outside the window (docs/producer.md, "Deduplication").
    db.query("UPDATE events SET day = %s WHERE id = 'evt_1'", (date.fromordinal(today.toordinal() - 2),))
    assert db.query(SEND, ("ws", "evt_1")) == [("live", 1)]
    assert db.query("SELECT count(*) FROM webhook_deliveries WHERE event_id = 'evt_1'") == [(2,)]


# ---------------------------------------------------------------- migrating a database with rows


LEASED_BY_OLD_WORKER = """
UPDATE webhook_deliveries SET locked_by = 'old-worker', locked_until = now() + interval '5 minutes',
       claim_token = nextval('webhook_claim_tokens')
 WHERE id IN (SELECT id FROM webhook_deliveries WHERE status = 'pending' ORDER BY id LIMIT 2)
RETURNING id, claim_token, endpoint_id
"""
ROWS = ("SELECT id, status, event_id, locked_by, locked_until, claim_token, created_at, tableoid::regclass::text "
        "FROM webhook_deliveries ORDER BY id")


def test_a_database_with_rows_of_0024_migrates_keeping_every_row_id_and_lease(
        empty_db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatcher import store

    shipped = store.migrations()
    monkeypatch.setattr(store, "migrations", lambda: [m for m in shipped if m.version <= 24])
    conn = empty_db.connect()
    try:
        store.migrate(conn)
    finally:
        conn.close()
    monkeypatch.undo()
    (endpoint,) = seed_workspace(empty_db.dsn, "ws", ["http://127.0.0.1:9/a"])
    for n in range(6):  # written by a producer of the release before: no day anywhere
        assert empty_db.query(SEND.replace(", 0)", ", 0, NULL)"), ("ws", f"old_{n}")) == [("live", 1)]
    empty_db.query("UPDATE webhook_deliveries SET status = 'delivered' WHERE event_id IN ('old_0', 'old_1')")
    empty_db.query("INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, "
                   "duration_ms, result) SELECT id, endpoint_id, 1, now(), 5, 'delivered' FROM webhook_deliveries "
                   "WHERE status = 'delivered'")
    leased = empty_db.query(LEASED_BY_OLD_WORKER)  # an older worker is sending these right now
    before = empty_db.query(ROWS)
    attempts_before = empty_db.query("SELECT id, delivery_id FROM webhook_delivery_attempts ORDER BY id")

    conn = empty_db.connect()
    try:
        assert store.migrate(conn) == [m.version for m in shipped if m.version > 24]  # 0025-0027, and after
    finally:
        conn.close()

    after = empty_db.query(ROWS)
    assert [row[:-1] for row in after] == [row[:-1] for row in before], "every row, its id and its lease"
    assert {row[-1] for row in after} == {"webhook_deliveries_before"}
    assert empty_db.query("SELECT id, delivery_id FROM webhook_delivery_attempts ORDER BY id") == attempts_before
    assert empty_db.query("SELECT DISTINCT tableoid::regclass::text, day FROM events") == [
        ("events_before", date(2000, 1, 1))]
    assert empty_db.query("SELECT DISTINCT event_day FROM webhook_deliveries") == [(date(2000, 1, 1),)]

    # The older worker's results land: its claim token is the row's.
    engine = _store(empty_db)
    results = [AttemptRecord(id_, token, endpoint_id, "delivered", 1, 0.0, None, 200, "delivered",
                             time.monotonic(), 5, "ok") for id_, token, endpoint_id in leased]
    assert engine.record(results) == {id_ for id_, _, _ in leased}
    # The rest is claimed and delivered by the new code, its events found in the legacy partition.
    claimed = engine.claim("new-worker", 10, 4, [], 0, 30.0, window=engine.claim_window())
    assert sorted(row.event_id for row in claimed) == ["old_4", "old_5"]
    assert all(row.event_type == "job.created" and row.payload == '{"n": 1}' for row in claimed)
    assert engine.record([_delivered(row) for row in claimed]) == {row.id for row in claimed}
    assert empty_db.query("SELECT status, count(*) FROM webhook_deliveries GROUP BY 1") == [("delivered", 6)]
    today = _today(empty_db)
    assert {partitions.day_of_id(id_) for id_, in empty_db.query(
        "SELECT id FROM webhook_delivery_attempts WHERE id > %s", (attempts_before[-1][0],))} == {today}

    # New rows: ids of today, in today's partitions; a resend of a legacy event is still refused.
    assert empty_db.query(SEND, ("ws", "new_1")) == [("live", 1)]
    assert empty_db.query(SEND, ("ws", "old_3")) == [("duplicate", 0)]
    ((id_, where, event_day),) = empty_db.query(
        "SELECT id, tableoid::regclass::text, event_day FROM webhook_deliveries WHERE event_id = 'new_1'")
    assert (partitions.day_of_id(id_), where, event_day) == (
        today, partitions.partition_name("webhook_deliveries", today), today)
    assert id_ > before[-1][0], "ids keep increasing: API cursors by id keep their order"
    assert empty_db.query("SELECT table_name FROM partitioning WHERE legacy_until <= now() ORDER BY 1") == [
        ("events",), ("webhook_deliveries",), ("webhook_delivery_attempts",)]


# ---------------------------------------------------------------- the API's attempts of a delivery


def test_a_delivery_s_attempts_are_read_from_its_day_before_on_and_all_found(db: Database) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    today = _today(db).toordinal()
    days = {n: date.fromordinal(today - n) for n in range(2, 7)}
    for day in days.values():
        _attach_day(db, "webhook_delivery_attempts", day)
    _attach_day(db, "webhook_deliveries", days[4])
    (delivery,), = db.query("INSERT INTO webhook_deliveries (id, workspace_id, endpoint_id, event_id, payload_hash, "
                            "status) VALUES (%s, 'ws', %s, 'e', 'h', 'delivered') RETURNING id",
                            (partitions.first_id(days[4]) + 1, endpoint))
    # Retried across three days: the last attempt under today's id (DEFAULT: no partition of today here).
    for attempt, first in enumerate((partitions.first_id(days[4]) + 5, partitions.first_id(days[3]) + 5, None), 1):
        db.query("INSERT INTO webhook_delivery_attempts (id, delivery_id, endpoint_id, attempt, started_at, "
                 "duration_ms, result) VALUES (coalesce(%s, dispatcher_next_id('webhook_delivery_attempts_id_seq')),"
                 " %s, %s, %s, now(), 1, 'http_5xx')", (first, delivery, endpoint, attempt))
    conn = db.connect()
    try:
        found = get_delivery(conn, "ws", delivery)
    finally:
        conn.close()
    assert [a["attempt"] for a in found["attempts"]] == [1, 2, 3]

    read = _attempts_read(db, [delivery])
    names = {n: partitions.partition_name("webhook_delivery_attempts", day) for n, day in days.items()}
    assert {names[5], names[4], names[3], names[2]} <= read, "its day, the day before it (a clock's margin), after"
    assert names[6] not in read and "webhook_delivery_attempts_before" not in read, "nothing older is read"


def test_a_delivery_from_before_the_day_ids_has_every_attempts_partition_read(db: Database) -> None:
    assert "webhook_delivery_attempts_before" in _attempts_read(db, [7, partitions.first_id(_today(db))])
