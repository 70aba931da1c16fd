"""The partitions' side of the store (issue 25): what the upkeep leader's partition policy reads, and the
DDL it asks for (``sql/partitions.sql``; ``dispatcher_create_partition`` and ``dispatcher_drop_partition``).

The DDL runs under ``partitions.lock_timeout``: a CREATE or DETACH that cannot have its table's lock at
once gives up rather than queue every producer behind it.  That, and any other refusal of one partition's
DDL, comes back as an :class:`Outcome` the upkeep logs and retries next round, never as an exception; only
a lost connection is raised (the upkeep loop's ``DatabaseUnavailable``).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg2.errorcodes

from dispatcher.rules.partitions import EVENTS_LEGACY_END, Kind, Partition, ahead_days, from_bounds
from dispatcher.store.engine import ManagedConnection
from dispatcher.store.errors import QueryRejected
from dispatcher.store.queries import QUERIES, Connection, named_rows, query_rows

DAY = datetime.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Listing:
    """The partitions, the database clock and ``partitioning.legacy_until``, read in one transaction."""

    now: datetime.datetime
    partitions: tuple[Partition, ...]
    legacy_until: Mapping[str, datetime.datetime]


@dataclass(frozen=True, slots=True)
class Outcome:
    done: bool            # created, or detached and dropped
    retry: bool = False   # its table's lock was not free within partitions.lock_timeout
    detail: str = ""      # why not done, for the log


def _partition(row: Mapping[str, Any]) -> Partition:
    events = row["parent"] == "events"
    found = from_bounds(row["parent"], row["name"], row["lower_day"] if events else row["lower_id"],
                        row["upper_day"] if events else row["upper_id"], bool(row["is_default"]))
    return Partition(found.table, found.name, found.kind, found.day, open_rows=bool(row["open_rows"]),
                     ended_rows=bool(row["ended_rows"]))


def days_ahead(conn: Connection) -> dict[str, int]:
    """Per partitioned table, the days after today (the database's) that have a partition, from the
    catalog alone: ``dispatcher check`` and ``status``, inside their read-only transaction."""
    partitions = [_partition(row) for row in query_rows(conn, "partitions_list", {"facts": False})]
    today = query_rows(conn, "partitions_legacy_until")[0]["db_now"].astimezone(datetime.UTC).date()
    return ahead_days(today, partitions)


def _refused(exc: QueryRejected, what: str) -> Outcome:
    if exc.pgcode == psycopg2.errorcodes.LOCK_NOT_AVAILABLE:
        return Outcome(False, retry=True, detail=f"{what}: its table stayed busy past partitions.lock_timeout")
    if exc.pgcode == psycopg2.errorcodes.CHECK_VIOLATION:
        return Outcome(False, detail=f"{what}: the DEFAULT partition holds rows of that day, which stay there "
                                     f"(pruned row by row) ({exc.detail or exc})")
    return Outcome(False, detail=f"{what}: {exc}")


def _lock_timeout(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


class PartitionStore:
    def __init__(self, conn: ManagedConnection) -> None:
        self._conn = conn

    def listing(self) -> Listing:
        with self._conn.transaction() as tx:
            tx.execute(QUERIES["partitions_list"], {"facts": True})
            rows = tx.fetchall()
            tx.execute(QUERIES["partitions_legacy_until"])
            legacy = tx.fetchall()
        return Listing(now=legacy[0]["db_now"], partitions=tuple(_partition(row) for row in rows),
                       legacy_until={r["table_name"]: r["legacy_until"] for r in legacy
                                     if r["table_name"] is not None and r["legacy_until"] is not None})

    def events_referenced(self, partition: Partition) -> bool:
        """Whether a delivery row refers to an event of an events partition (a day, or events_before)."""
        if partition.kind is Kind.DAY and partition.day is not None:
            lower, upper = partition.day, partition.day + DAY
        elif partition.kind is Kind.BEFORE:
            lower, upper = None, EVENTS_LEGACY_END
        else:
            return True  # DEFAULT or a foreign range: never dropped anyway
        with self._conn.statement() as cur:
            cur.execute(QUERIES["partitions_events_referenced"], {"lower": lower, "upper": upper})
            return bool(named_rows(cur)[0]["referenced"])

    def create(self, table: str, day: datetime.date, lock_timeout: float) -> Outcome:
        """Create ``table``'s partition for ``day`` (not done: it existed, or see ``detail``)."""
        what = f"creating {table}'s partition for {day.isoformat()}"
        try:
            with self._conn.statement() as cur:
                cur.execute(QUERIES["partitions_create"], {"parent": table, "day": day,
                                                           "lock_timeout": _lock_timeout(lock_timeout)})
                created = named_rows(cur)[0]["created"]
        except QueryRejected as exc:
            return _refused(exc, what)
        return Outcome(True) if created else Outcome(False, detail=f"{what}: it exists already")

    def drop(self, partition: Partition, lock_timeout: float) -> Outcome:
        """Detach and drop ``partition`` (not done: the database's check under the lock kept it, see
        ``detail``, or its table was busy)."""
        what = f"dropping {partition.name}"
        try:
            with self._conn.statement() as cur:
                cur.execute(QUERIES["partitions_drop"], {"parent": partition.table, "name": partition.name,
                                                         "lock_timeout": _lock_timeout(lock_timeout)})
                kept = named_rows(cur)[0]["kept"]
        except QueryRejected as exc:
            return _refused(exc, what)
        return Outcome(True) if kept is None else Outcome(False, detail=f"{what}: kept, {kept}")
