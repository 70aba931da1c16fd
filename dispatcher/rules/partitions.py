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

Policy.  The upkeep leader (``dispatcher.engine.upkeep``) lists the partitions
with a few facts and asks :meth:`PartitionPolicy.plan` what to do: which day
partitions to create ahead, which to drop whole, and which wait, and why.  A
row never moves between partitions: a partition goes when every row in it is
past its retention and none still owes a delivery, or it waits.  The rule per
table, with ``end`` the instant before which every row of the partition was
written (the end of its day; ``partitioning.legacy_until`` for ``*_before``):

* deliveries: kept until ``end + retention.delivered``; kept until
  ``end + retention.dead + ended_by`` when it holds a dead or failed row (such
  a row ends at most ``ended_by`` -- the longest retry ceiling and one
  ``breaker.open_for`` -- after it was created, as the row-by-row prune
  counted); then dropped, unless it holds a pending (leased included) or held
  row: then it *waits*;
* attempts: dropped at ``end + retention.attempts`` (attempt rows are final);
* events: dropped at ``end + retention.events``, unless a delivery row still
  refers to one of its events: then it *waits*;
* ``*_default``: never dropped (overflow only; the batched prune keeps it small).

The policy is pure too: the clock (``now``, the database's) and the facts are passed in.
"""

from __future__ import annotations

import datetime
import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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


# ---------------------------------------------------------------- the partition policy (upkeep)

DELIVERIES, ATTEMPTS, EVENTS = TABLES
LEGACY_ID_END = 1 << DAY_BITS  # first_id(2020-01-02): where *_before ends (legacy ids are plain sequence values)
EVENTS_LEGACY_END = date(2000, 1, 2)  # events_before ends here: legacy rows have day 2000-01-01


def before_name(table: str) -> str:
    return f"{table}_before"


def default_name(table: str) -> str:
    return f"{table}_default"


DAY = datetime.timedelta(days=1)


class Kind(enum.Enum):
    DAY = "day"          # one UTC day's rows
    BEFORE = "before"    # the legacy table, attached below the first day
    DEFAULT = "default"  # the overflow partition
    OTHER = "other"      # bounds this policy does not know: never touched


class Action(enum.Enum):
    KEEP = "keep"  # some row is inside its retention: nothing to do yet
    WAIT = "wait"  # past retention, but a row still owes a delivery (or is referred to): reported
    DROP = "drop"  # every row is past its retention: detach and drop it whole


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition as the listing found it, with the facts the rule reads (deliveries' and events' only)."""

    table: str
    name: str
    kind: Kind
    day: datetime.date | None = None  # a day partition's day
    open_rows: bool = False           # deliveries: a pending (leased included) or held row
    ended_rows: bool = False          # deliveries: a dead or failed row
    referenced: bool | None = None    # events: a delivery refers to one of its events; None: not probed


def from_bounds(table: str, name: str, lower: int | datetime.date | None, upper: int | datetime.date | None,
                is_default: bool) -> Partition:
    """A partition from its bounds as the catalog has them (None: MINVALUE or MAXVALUE): what kind it is
    follows from the bounds, never from the name, so a partition made by hand is never mistaken for a day."""
    if is_default:
        return Partition(table, name, Kind.DEFAULT)
    if table == EVENTS:
        if lower is None and upper == EVENTS_LEGACY_END:
            return Partition(table, name, Kind.BEFORE)
        if isinstance(lower, datetime.date) and upper == lower + DAY:
            return Partition(table, name, Kind.DAY, lower)
        return Partition(table, name, Kind.OTHER)
    if lower is None and upper == LEGACY_ID_END:
        return Partition(table, name, Kind.BEFORE)
    if isinstance(lower, int) and lower % LEGACY_ID_END == 0 and upper == lower + LEGACY_ID_END:
        return Partition(table, name, Kind.DAY, day_of_id(lower))
    return Partition(table, name, Kind.OTHER)


@dataclass(frozen=True, slots=True)
class Decision:
    partition: Partition
    action: Action
    reason: str  # for an operator: why it is kept, waits or goes


@dataclass(frozen=True, slots=True)
class Plan:
    create: tuple[tuple[str, datetime.date], ...]  # (table, day) to create, today's first
    drop: tuple[Decision, ...]
    wait: tuple[Decision, ...]
    keep: tuple[Decision, ...]
    ahead: Mapping[str, int] = field(default_factory=dict)  # per table: days after today with a partition


def _end_of_day(day: datetime.date) -> datetime.datetime:
    return datetime.datetime.combine(day + DAY, datetime.time(), datetime.UTC)


def _when(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True, slots=True)
class PartitionPolicy:
    """``partitions.days_ahead`` and the ``retention.*`` settings (seconds); ``ended_by`` is how long after
    its creation a row may still end dead or failed (the longest retry ceiling plus ``breaker.open_for``)."""

    days_ahead: int = 7
    delivered: float = 7 * 86400.0
    dead: float = 30 * 86400.0
    ended_by: float = 86400.0 + 300.0
    attempts: float = 30 * 86400.0
    events: float = 90 * 86400.0

    def __post_init__(self) -> None:
        if self.days_ahead < 1:
            raise ValueError("days_ahead must be at least 1")
        for name in ("delivered", "dead", "ended_by", "attempts", "events"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0")

    def missing(self, today: datetime.date, partitions: Iterable[Partition]) -> list[tuple[str, datetime.date]]:
        """(table, day) of every day from today to today + days_ahead that has no partition, today's first."""
        have = {(p.table, p.day) for p in partitions if p.kind is Kind.DAY}
        days = [today + n * DAY for n in range(self.days_ahead + 1)]
        return [(table, day) for day in days for table in TABLES if (table, day) not in have]

    def end(self, partition: Partition, legacy_until: Mapping[str, datetime.datetime]) -> datetime.datetime | None:
        """The instant before which every row of ``partition`` was written; None: unknown or unbounded."""
        if partition.kind is Kind.DAY and partition.day is not None:
            return _end_of_day(partition.day)
        if partition.kind is Kind.BEFORE:
            return legacy_until.get(partition.table)
        return None

    def retained_until(self, partition: Partition, end: datetime.datetime) -> datetime.datetime:
        """When the last row of a partition that ends at ``end`` is past its retention."""
        if partition.table == ATTEMPTS:
            return end + datetime.timedelta(seconds=self.attempts)
        if partition.table == EVENTS:
            return end + datetime.timedelta(seconds=self.events)
        keep = max(self.delivered, self.dead + self.ended_by) if partition.ended_rows else self.delivered
        return end + datetime.timedelta(seconds=keep)

    def past_retention(self, partition: Partition, now: datetime.datetime,
                       legacy_until: Mapping[str, datetime.datetime]) -> bool:
        """Whether every row is past its retention by the clock alone (the facts that make it wait aside):
        the events partitions worth probing for references."""
        end = self.end(partition, legacy_until)
        return end is not None and now >= self.retained_until(partition, end)

    def decide(self, partition: Partition, now: datetime.datetime,
               legacy_until: Mapping[str, datetime.datetime]) -> Decision:
        """Keep, wait or drop ``partition`` at ``now``."""
        if partition.kind is Kind.DEFAULT:
            return Decision(partition, Action.KEEP, "the overflow partition: never dropped, pruned row by row")
        if partition.kind is Kind.OTHER:
            return Decision(partition, Action.KEEP, "bounds that are neither a day nor the legacy range: "
                                                    "not managed by the upkeep")
        end = self.end(partition, legacy_until)
        if end is None:
            return Decision(partition, Action.WAIT, "no partitioning.legacy_until recorded for its table: "
                                                    "its rows' age is unknown")
        until = self.retained_until(partition, end)
        if now < until:
            return Decision(partition, Action.KEEP, self._kept_because(partition, until))
        if partition.table == DELIVERIES and partition.open_rows:
            return Decision(partition, Action.WAIT, "holds pending or held rows, which still owe a delivery "
                                                    f"(every other row past retention since {_when(until)})")
        if partition.table == EVENTS and partition.referenced is not False:
            return Decision(partition, Action.WAIT, "delivery rows still refer to its events "
                                                    f"(past retention.events since {_when(until)})")
        return Decision(partition, Action.DROP, f"every row past its retention since {_when(until)}")

    def _kept_because(self, partition: Partition, until: datetime.datetime) -> str:
        if partition.table == ATTEMPTS:
            return f"attempt history inside retention.attempts until {_when(until)}"
        if partition.table == EVENTS:
            return f"events inside retention.events until {_when(until)}"
        if partition.ended_rows and self.dead + self.ended_by > self.delivered:
            return f"dead or failed rows inside retention.dead until {_when(until)}"
        return f"delivered rows inside retention.delivered until {_when(until)}"

    def plan(self, now: datetime.datetime, partitions: Iterable[Partition],
             legacy_until: Mapping[str, datetime.datetime]) -> Plan:
        """Everything the upkeep does to the partitions at ``now`` (a timezone-aware instant)."""
        found = list(partitions)
        today = now.astimezone(datetime.UTC).date()
        decisions = [self.decide(p, now, legacy_until) for p in found]
        return Plan(create=tuple(self.missing(today, found)),
                    drop=tuple(d for d in decisions if d.action is Action.DROP),
                    wait=tuple(d for d in decisions if d.action is Action.WAIT),
                    keep=tuple(d for d in decisions if d.action is Action.KEEP),
                    ahead=ahead_days(today, found))


def ahead_days(today: datetime.date, partitions: Iterable[Partition]) -> dict[str, int]:
    """Per table, how many days after ``today`` have a partition, counted without a gap from tomorrow:
    rows of a day without one go to the table's DEFAULT partition (never lost, but pruned row by row)."""
    have = {(p.table, p.day) for p in partitions if p.kind is Kind.DAY}
    ahead = {}
    for table in TABLES:
        count = 0
        while (table, today + (count + 1) * DAY) in have:
            count += 1
        ahead[table] = count
    return ahead
