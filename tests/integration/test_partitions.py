"""The outbox partitioned by day (migrations 0025-0027) against a real Postgres.

The id rule's SQL functions and their Python twins (dispatcher/rules/partitions.py)
agree on the same cases; the partitions the migrations made are where they should be.
"""

from __future__ import annotations

from datetime import date

import pytest

from dispatcher.rules import partitions
from tests.conftest import TestDatabase as Database

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
