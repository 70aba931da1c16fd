"""Operations' side of the store: the fleet's heartbeat rows, and the reads
behind ``dispatcher status`` and ``dispatcher check`` (``sql/operations.sql``).

Two kinds of caller:

* :class:`Presence`, on a worker's :class:`ManagedConnection`: one upsert per
  ``workers.status_interval`` (the heartbeat greenlet) and one leader stamp
  per upkeep round (on the connection that holds the leader's lock);
* :func:`health_figures` and :func:`region_status`, on a plain connection of
  the CLI, each one read-only transaction under a statement timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatcher.rules.health import BacklogFigures, BacklogRule, FleetFigures
from dispatcher.store import QUERIES, Connection, query_rows, transaction
from dispatcher.store.engine import ManagedConnection, backlog_figures
from dispatcher.store.partitions import days_ahead


class Presence:
    """A worker process's row in ``dispatcher_processes``."""

    def __init__(self, conn: ManagedConnection, owner: str, region: str) -> None:
        self._conn = conn
        self.owner = owner
        self.region = region

    def beat(self, host: str, pid: int, started: float, in_flight: int) -> None:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["operations_heartbeat"], {
                "owner": self.owner, "region": self.region, "host": host, "pid": pid, "started": started,
                "in_flight": in_flight})

    def leave(self) -> None:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["operations_leave"], {"owner": self.owner})

    def mark_leader(self, alive_within: float) -> int:
        """Stamp this process as the region's upkeep leader; returns the live workers."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["operations_mark_leader"],
                        {"owner": self.owner, "region": self.region, "alive_within": alive_within})
            return int(cur.fetchone()[0])

    def prune(self) -> int:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["operations_prune_processes"])
            return int(cur.rowcount)


def record_stop(conn: ManagedConnection, region: str, owners: list[str], how: str, host: str, pid: int) -> None:
    """A supervisor stopped: remove its workers' rows and record the region's last stop (migration 0024)."""
    with conn.statement() as cur:
        cur.execute(QUERIES["operations_stopped"], {"owners": owners, "region": region, "how": how, "host": host,
                                                    "pid": pid})


@dataclass(frozen=True, slots=True)
class Thresholds:
    """What the reads need from the configuration."""

    region: str
    backlog: BacklogRule
    heartbeat_age: float    # a worker is alive when its heartbeat is newer than this
    leader_age: float       # a leader stamp newer than this names the current leader
    timeout: float          # statement timeout of every read, seconds


def _begin(conn: Connection, timeout: float) -> None:
    query_rows(conn, "operations_statement_timeout", {"ms": str(max(1, int(timeout * 1000)))})


def _fleet(conn: Connection, limits: Thresholds) -> FleetFigures:
    (row,) = query_rows(conn, "operations_fleet", {"region": limits.region, "alive_within": limits.heartbeat_age})
    return FleetFigures(heartbeat_age=row["heartbeat_age"], workers_alive=int(row["workers_alive"]),
                        leader_age=row["leader_age"], stopped_age=row["stopped_age"],
                        stopped_how=row["stopped_how"], rows_waiting=bool(row["rows_waiting"]))


def health_figures(conn: Connection, limits: Thresholds) -> tuple[BacklogFigures, FleetFigures, dict[str, int]]:
    """The figures ``dispatcher check`` judges: the backlog by the same query
    as the upkeep leader's alert (engine_backlog), the fleet's heartbeats, and
    the days of partitions ahead of each partitioned table."""
    with transaction(conn):
        _begin(conn, limits.timeout)
        (row,) = query_rows(conn, "engine_backlog", {"row_age": limits.backlog.row_age,
                                                     "threshold": limits.backlog.rows})
        fleet = _fleet(conn, limits)
        return backlog_figures(row), fleet, days_ahead(conn)


def region_status(conn: Connection, limits: Thresholds) -> dict[str, Any]:
    """Everything ``dispatcher status`` shows, as plain values (datetimes stay datetimes)."""
    with transaction(conn):
        _begin(conn, limits.timeout)
        (backlog,) = query_rows(conn, "engine_backlog", {"row_age": limits.backlog.row_age,
                                                         "threshold": limits.backlog.rows})
        (pending,) = query_rows(conn, "operations_pending")
        oldest = query_rows(conn, "operations_oldest_due")
        processes = query_rows(conn, "operations_workers", {
            "region": limits.region, "alive_within": limits.heartbeat_age, "leader_within": limits.leader_age})
        return {
            "backlog": backlog_figures(backlog),
            "fleet": _fleet(conn, limits),
            "pending": pending,
            "oldest_due": oldest[0] if oldest else None,
            "statuses": query_rows(conn, "operations_status_counts"),
            "breakers": query_rows(conn, "operations_breakers"),
            "top_failing": query_rows(conn, "operations_top_failing"),
            "processes": processes,
            "last_stop": next(iter(query_rows(conn, "operations_last_stop", {"region": limits.region})), None),
            "partitions_ahead": days_ahead(conn),
        }
