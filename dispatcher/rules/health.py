"""The region's health rules, pure: figures and thresholds in, a verdict out.

Written once and used twice, so that the two can never disagree:

* the upkeep leader's in-process backlog alert (``dispatcher.engine.upkeep``), and
* ``dispatcher check``, the external probe that reads the database itself and
  therefore still fires when every dispatcher is dead (``dispatcher.cli.status``).

Both measure the backlog with the same named query (``engine_backlog``) into a
:class:`BacklogFigures` and judge it with :class:`BacklogRule`.  Rows waiting
behind an open or half-open breaker are measured separately (``held_rows``)
and never count toward the backlog: their wait is the breaker's design, and
alerting on them would page on every customer's maintenance window.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

# Fewer days after today with a day partition than this, for any partitioned table, is a WARNING: the
# upkeep leader keeps partitions.days_ahead (7) of them, so two left means it has failed to create one
# for days (no leader, or a table whose lock it never got).  Rows of a day without a partition are not
# lost: they go to the table's DEFAULT partition, which is pruned row by row (docs/operations.md,
# "Partition maintenance").
PARTITION_DAYS_AHEAD = 2


class Severity(enum.IntEnum):
    """Nagios plugin exit codes, which ``dispatcher check`` exits with."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


@dataclass(frozen=True, slots=True)
class BacklogFigures:
    """What ``engine_backlog`` measured; every figure counts closed-breaker endpoints only, but ``held_rows``."""

    overdue_rows: int           # pending rows due for longer than the rule's row_age (bounded at rows + 1)
    oldest_age: float | None    # seconds the oldest due pending row has waited; None: nothing is due
    held_rows: int              # due pending rows behind an open or half-open breaker
    open_breakers: int          # endpoints whose breaker is open or half-open


@dataclass(frozen=True, slots=True)
class BacklogRule:
    """RFC-014 "Backlog growth": alert when more than ``rows`` pending rows are
    overdue by more than ``row_age`` seconds, or when the oldest pending row is
    overdue by more than ``oldest_age`` seconds."""

    rows: int = 10_000
    row_age: float = 300.0
    oldest_age: float = 900.0

    def breaches(self, figures: BacklogFigures) -> list[str]:
        """One line per breached condition; empty when the backlog is healthy."""
        found = []
        if figures.overdue_rows > self.rows:
            found.append(f"more than {self.rows} pending rows overdue by more than {self.row_age:g}s")
        if (figures.oldest_age or 0.0) > self.oldest_age:
            found.append(f"oldest pending row overdue by {figures.oldest_age:.0f}s (limit {self.oldest_age:g}s)")
        return found


@dataclass(frozen=True, slots=True)
class FleetFigures:
    """The fleet as the database last saw it (``dispatcher_processes``)."""

    heartbeat_age: float | None   # seconds since the freshest worker heartbeat; None: no worker row at all
    workers_alive: int            # processes whose heartbeat is within the rule's heartbeat_age
    leader_age: float | None      # seconds since the freshest upkeep round of a leader; None: never
    stopped_age: float | None = None  # seconds since the region's last clean stop (fleet_stops); None: none
    stopped_how: str | None = None    # how it stopped, e.g. "TERM: graceful shutdown"
    rows_waiting: bool = True         # any pending row at all (default: assume so, the alerting side)


@dataclass(frozen=True, slots=True)
class FleetRule:
    heartbeat_age: float = 60.0   # no worker heartbeat for longer: the fleet is dead (CRITICAL)
    leader_age: float = 120.0     # no upkeep round for longer while workers live: no leader (WARNING)

    def breaches(self, figures: FleetFigures) -> tuple[Severity, list[str]]:
        if figures.heartbeat_age is None:
            return self._no_workers(figures)
        if figures.heartbeat_age > self.heartbeat_age:
            return Severity.CRITICAL, [f"dead fleet: no worker heartbeat for {figures.heartbeat_age:.0f}s "
                                       f"(limit {self.heartbeat_age:g}s)"]
        if figures.leader_age is None or figures.leader_age > self.leader_age:
            since = "ever" if figures.leader_age is None else f"for {figures.leader_age:.0f}s"
            return Severity.WARNING, [f"no upkeep leader: no upkeep round {since} (limit {self.leader_age:g}s); "
                                      "backlog alerts, gauges, sweeps and retention are not running"]
        return Severity.OK, []

    @staticmethod
    def _no_workers(figures: FleetFigures) -> tuple[Severity, list[str]]:
        """No worker row: every worker stopped cleanly (a supervisor removes its workers' rows as it stops), or
        none ever ran.  Either is said as it is; it is CRITICAL only while rows wait, since then nothing
        delivers them, and otherwise a note (OK): a stopped region with nothing to send harms no one yet."""
        if figures.stopped_age is None:
            said = "fleet never run: no dispatcher worker has ever recorded a heartbeat"
        else:
            said = f"fleet stopped {figures.stopped_age:.0f}s ago ({figures.stopped_how or 'how unknown'})"
        if figures.rows_waiting:
            return Severity.CRITICAL, [f"{said}; pending rows wait and no worker delivers them"]
        return Severity.OK, [f"{said}; no pending rows"]


@dataclass(frozen=True, slots=True)
class Verdict:
    severity: Severity
    problems: tuple[str, ...]


def partition_breaches(days_ahead: Mapping[str, int]) -> list[str]:
    """One line per partitioned table with fewer than PARTITION_DAYS_AHEAD days of partitions after today."""
    return [f"{table} has partitions for {days} days ahead only (fewer than {PARTITION_DAYS_AHEAD}): rows of a "
            "day without one go to its DEFAULT partition" for table, days in sorted(days_ahead.items())
            if days < PARTITION_DAYS_AHEAD]


def judge(backlog: BacklogFigures, fleet: FleetFigures, backlog_rule: BacklogRule, fleet_rule: FleetRule,
          days_ahead: Mapping[str, int] | None = None) -> Verdict:
    """``dispatcher check``'s verdict: a backlog breach is CRITICAL (the RFC's
    page), a dead fleet CRITICAL, a missing leader WARNING, too few day
    partitions ahead WARNING; held rows never alert."""
    severity, problems = fleet_rule.breaches(fleet)
    backlog_problems = backlog_rule.breaches(backlog)
    if backlog_problems:
        severity = Severity.CRITICAL
    partition_problems = partition_breaches(days_ahead or {})
    if partition_problems:
        severity = max(severity, Severity.WARNING)
    return Verdict(severity, tuple(backlog_problems + problems + partition_problems))
