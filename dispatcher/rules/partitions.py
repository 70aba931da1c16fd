"""The outbox partitioned by day (migrations 0025-0027; docs/claim.md, docs/operations.md).

``webhook_deliveries`` and ``webhook_delivery_attempts`` are partitioned by
RANGE (id), and an id encodes the UTC day it was written: a day's first id is
``(day - 2020-01-01) << 38``, so each day holds 2^38 ids.  ``events`` is
partitioned by its ``day`` column.  A table's partition for one day is named
``<table>_pYYYYMMDD``; the legacy table is ``<table>_before`` and the DEFAULT
partition ``<table>_default``.

These are the Python twins of the SQL functions dispatcher_first_id,
dispatcher_day_of_id and dispatcher_partition_name (0025);
tests/integration/test_partitions.py holds both to the same cases.  Pure: no
clock, no I/O.
"""

from __future__ import annotations

from datetime import date, timedelta

EPOCH = date(2020, 1, 1)  # day 0: every id written before 0027 (a plain sequence value) is in it
DAY_BITS = 38             # ids per day: 2^38
TABLES = ("webhook_deliveries", "webhook_delivery_attempts", "events")


def first_id(day: date) -> int:
    """The first id of ``day``: ids of that day are [first_id(day), first_id(day + 1 day))."""
    return (day - EPOCH).days << DAY_BITS


def day_of_id(id_: int) -> date:
    """The UTC day an id was written on (EPOCH for ids written before migration 0027)."""
    return EPOCH + timedelta(days=id_ >> DAY_BITS)


def partition_name(table: str, day: date) -> str:
    """The name of ``table``'s partition for ``day``: ``events_p20260131``."""
    return f"{table}_p{day:%Y%m%d}"
