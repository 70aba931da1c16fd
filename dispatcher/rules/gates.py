"""The rollout gates (RFC-014 "Rollout plan"), pure: evidence in, a verdict out.

``dispatcher gate`` gathers the evidence (``dispatcher/cli/gate.py``: the
database through ``store.rollout``, the operator's exported files) and these
functions judge it, each by the RFC's own criteria over the RFC's own window:

* phase 0: "outbox insert adds under 2 ms p99 to producers; dry-run backlog
  age stays under 5 s for 72 hours";
* phase 1: "zero lost events versus the synchronous path over one week,
  verified by comparing event IDs received by the test receiver";
* phase 2: "failed-and-never-retried rate below 0.05% for beta workspaces"
  (its "no P1 support tickets attributable to duplicates" is a person's
  call: the known duplicate sends are reported as evidence for it);
* phase 3: "backlog age p99 under 15 s at 100%; alert volume unchanged for
  one week".

Each criterion ends ``pass``, ``fail`` or ``incomplete``.  A breach seen in
the evidence there is fails it, whatever else is missing; otherwise anything
missing or too short leaves it incomplete, naming each missing piece.  A gate
passes only when every criterion passes, fails when one fails, and is
incomplete otherwise: missing evidence is never a pass.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

PHASE0_WINDOW = timedelta(hours=72)
PHASE1_WINDOW = timedelta(days=7)
PHASE2_DEFAULT_WINDOW = timedelta(days=7)   # the RFC names none for phase 2
PHASE3_WINDOW = timedelta(days=7)

PRODUCER_P99_S = 0.002
PHASE0_BACKLOG_MAX_S = 5.0
NEVER_RETRIED_RATE = 0.0005                 # 0.05 %
# Fewer base rows than this cannot show a rate under 0.05 %: with no failure
# at all the rate is 0, but one failure more would already be 1/N >= 0.05 %.
NEVER_RETRIED_MIN_BASE = math.ceil(1 / NEVER_RETRIED_RATE)
PHASE3_BACKLOG_P99_S = 15.0
ROLLOUT_FULL = 100

# The dry run must have run all along: shadow rows written in every hour of the window.
SHADOW_COVERAGE = timedelta(hours=1)
# The producer timings export: its span must reach within this of the
# window's ends, and a counter reset after a longer silence lost observations.
TIMINGS_MAX_GAP = timedelta(minutes=5)
# At most this many gaps are named one by one; the rest are counted.
NAMED_GAPS = 5


class Result(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCOMPLETE = "incomplete"


@dataclass(frozen=True, slots=True)
class Window:
    since: datetime
    until: datetime

    @property
    def length(self) -> timedelta:
        return self.until - self.since

    def before(self) -> Window:
        """The stretch of the same length that ends where this one starts."""
        return Window(self.since - self.length, self.since)


@dataclass(frozen=True, slots=True)
class Criterion:
    name: str
    figure: str
    value: float | int | None
    threshold: str
    result: Result
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    gate: str
    window: Window
    criteria: tuple[Criterion, ...]
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def result(self) -> Result:
        results = {c.result for c in self.criteria}
        if Result.FAIL in results:
            return Result.FAIL
        return Result.INCOMPLETE if Result.INCOMPLETE in results or not results else Result.PASS

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(line for c in self.criteria for line in c.missing)


def criterion(name: str, figure: str, value: float | int | None, threshold: str, breached: bool,
              missing: Iterable[str]) -> Criterion:
    """Fail on a breach seen; else incomplete when anything is missing or there is no value; else pass."""
    missing = tuple(missing)
    if value is None and not missing:
        missing = (f"{figure}: no data",)
    result = Result.FAIL if breached else Result.INCOMPLETE if missing else Result.PASS
    return Criterion(name, figure, value, threshold, result, missing)


# ---------------------------------------------------------------- building blocks


def span(seconds: float) -> str:
    """A length for people: ``3 d 2 h``, ``2 h 10 min``, ``45 s``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:g} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, hours, days = int(seconds // 60) % 60, int(seconds // 3600) % 24, int(seconds // 86400)
    parts = [(days, "d"), (hours, "h"), (minutes, "min")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown)


def _at(when: datetime) -> str:
    return when.isoformat(sep=" ", timespec="seconds")


def window_criterion(window: Window, required: timedelta | None) -> Criterion:
    """The window is at least as long as the RFC's criterion needs."""
    hours = round(window.length.total_seconds() / 3600, 2)
    if required is None:
        return criterion("window", "window length, h", hours, "any length (the RFC names none)", False, [])
    short = window.length < required
    missing = [f"window: {span(window.length.total_seconds())} from {_at(window.since)}; the RFC's criterion "
               f"needs {span(required.total_seconds())} (--since, --until)"] if short else []
    return criterion("window", "window length, h", hours, f">= {required.total_seconds() / 3600:g} h", False,
                     missing)


def gaps(times: Iterable[datetime], window: Window, max_gap: timedelta) -> list[tuple[datetime, datetime]]:
    """Stretches of the window longer than ``max_gap`` with no sample: before the
    first, between two, after the last (samples outside the window are ignored)."""
    points = sorted(t for t in times if window.since <= t <= window.until)
    edges = [window.since, *points, window.until]
    return [(a, b) for a, b in zip(edges, edges[1:], strict=False) if b - a > max_gap]


def describe_gaps(what: str, found: Sequence[tuple[datetime, datetime]], max_gap: timedelta) -> list[str]:
    """One line per gap, the first few by name, then a count."""
    lines = [f"{what}: nothing from {_at(a)} to {_at(b)} ({span((b - a).total_seconds())}; "
             f"gaps over {span(max_gap.total_seconds())} are holes)" for a, b in found[:NAMED_GAPS]]
    if len(found) > NAMED_GAPS:
        rest = found[NAMED_GAPS:]
        total = sum((b - a).total_seconds() for a, b in rest)
        lines.append(f"{what}: and {len(rest)} more gaps ({span(total)} in all)")
    return lines


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks, as Postgres' ``percentile_cont``."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# ---------------------------------------------------------------- histograms (producer timings)


@dataclass(frozen=True, slots=True)
class CounterSeries:
    """One cumulative histogram bucket over time: observations <= ``le`` seconds."""

    le: float                                     # math.inf for the +Inf bucket
    points: tuple[tuple[datetime, float], ...]    # (time, cumulative count)


@dataclass(frozen=True, slots=True)
class Histogram:
    """The observations the series gained over their span, per bucket."""

    buckets: tuple[tuple[float, float], ...]      # (le, observations <= le), le ascending
    start: datetime | None
    end: datetime | None
    lost: tuple[tuple[datetime, datetime], ...]   # a counter reset after a silence longer than the gap


def histogram(series: Iterable[CounterSeries], max_gap: timedelta = TIMINGS_MAX_GAP) -> Histogram:
    """Each series' increase (a drop is a counter reset: the new value counts
    whole, as Prometheus' ``increase`` does), summed per bucket bound."""
    per_le: dict[float, float] = {}
    lost: list[tuple[datetime, datetime]] = []
    times: list[datetime] = []
    for one in series:
        points = sorted(one.points)
        times.extend(t for t, _ in points)
        gained = 0.0
        for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
            if v1 >= v0:
                gained += v1 - v0
            else:
                gained += v1
                if t1 - t0 > max_gap:
                    lost.append((t0, t1))
        per_le[one.le] = per_le.get(one.le, 0.0) + gained
    buckets: list[tuple[float, float]] = []
    running = 0.0
    for le in sorted(per_le):
        running = max(running, per_le[le])   # cumulative buckets never shrink (histogram_quantile's fix-up)
        buckets.append((le, running))
    return Histogram(tuple(buckets), min(times, default=None), max(times, default=None), tuple(sorted(set(lost))))


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile``: linear within the bucket the rank falls
    in (the first starts at 0); in the +Inf bucket, the highest finite bound."""
    if not buckets or buckets[-1][0] != math.inf or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    index = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    upper, count = buckets[index]
    if upper == math.inf:
        return buckets[-2][0] if len(buckets) > 1 else None
    lower, below = (0.0, 0.0) if index == 0 else buckets[index - 1]
    if index == 0 and upper <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / (count - below)


def _timings_missing(timings: Histogram, window: Window) -> list[str]:
    what = "producer timings"
    if timings.start is None or timings.end is None:
        return [f"{what}: the export holds no samples"]
    missing = []
    if timings.start > window.since + TIMINGS_MAX_GAP:
        missing.append(f"{what}: the export starts {_at(timings.start)}, after the window's start {_at(window.since)}")
    if timings.end < window.until - TIMINGS_MAX_GAP:
        missing.append(f"{what}: the export ends {_at(timings.end)}, before the window's end {_at(window.until)}")
    missing += [f"{what}: a counter reset after a silence from {_at(a)} to {_at(b)}: observations were lost"
                for a, b in timings.lost[:NAMED_GAPS]]
    if not timings.buckets or timings.buckets[-1][0] != math.inf:
        missing.append(f"{what}: no +Inf bucket (le=\"+Inf\"), so the total is unknown")
    elif timings.buckets[-1][1] <= 0:
        missing.append(f"{what}: no observation in the export's span")
    return missing


# ---------------------------------------------------------------- the evidence the database holds


@dataclass(frozen=True, slots=True)
class BacklogSamples:
    """The upkeep leader's backlog age, one sample per round (``backlog_samples``)."""

    times: tuple[datetime, ...]
    ages: tuple[float, ...]      # seconds the oldest due row had waited; 0 where none was due
    max_gap: timedelta           # alerts.leader_age: longer without a sample, no leader measured

    def within(self, window: Window) -> list[float]:
        return [age for t, age in zip(self.times, self.ages, strict=True) if window.since <= t <= window.until]

    def holes(self, what: str, window: Window) -> list[str]:
        return describe_gaps(what, gaps(self.times, window, self.max_gap), self.max_gap)


@dataclass(frozen=True, slots=True)
class ShadowRows:
    """Phase 0's shadow rows created in the window (the dry run's own record)."""

    rows: int
    unmarked: int                 # still pending
    longest_wait: float | None    # seconds from creation to being marked, or to now when not marked yet
    hours: frozenset[int]         # k: hour [since + k h, since + (k + 1) h) of the window has shadow rows


def empty_hours(window: Window, hours: frozenset[int]) -> list[tuple[datetime, datetime]]:
    """The stretches of whole coverage buckets (hours) in which no shadow row was written."""
    count = math.ceil(window.length / SHADOW_COVERAGE)
    found: list[tuple[datetime, datetime]] = []
    for k in range(count):
        if k in hours:
            continue
        start, end = window.since + k * SHADOW_COVERAGE, min(window.since + (k + 1) * SHADOW_COVERAGE, window.until)
        if found and found[-1][1] == start:
            found[-1] = (found[-1][0], end)
        else:
            found.append((start, end))
    return found


def _shadow_missing(window: Window, shadow: ShadowRows) -> list[str]:
    if shadow.rows == 0:
        return ["shadow rows: none written in the window (producers' producer.shadow_writes, rollout phase 0)"]
    holes = empty_hours(window, shadow.hours)
    lines = [f"shadow rows: none written from {_at(a)} to {_at(b)}: the dry run must run throughout "
             f"(a shadow row in every hour)" for a, b in holes[:NAMED_GAPS]]
    if len(holes) > NAMED_GAPS:
        lines.append(f"shadow rows: and {len(holes) - NAMED_GAPS} more stretches without one")
    return lines


def phase0(window: Window, timings: Histogram | str, samples: BacklogSamples, shadow: ShadowRows) -> Verdict:
    """``timings``: the producers' outbox-write histogram, or why there is none."""
    if isinstance(timings, str):
        p99, timings_missing, observations = None, [timings], None
    else:
        p99 = histogram_quantile(0.99, timings.buckets)
        timings_missing = _timings_missing(timings, window)
        observations = timings.buckets[-1][1] if timings.buckets else 0
    producer = criterion("producer_p99", "outbox insert added to producers, p99, s", p99,
                         f"< {PRODUCER_P99_S:g} s", p99 is not None and p99 >= PRODUCER_P99_S, timings_missing)
    sampled = samples.within(window)
    worst = max([*sampled, *([shadow.longest_wait] if shadow.longest_wait is not None else [])], default=None)
    backlog = criterion("dry_run_backlog_max", "dry-run backlog age, maximum, s", worst,
                        f"< {PHASE0_BACKLOG_MAX_S:g} s", worst is not None and worst >= PHASE0_BACKLOG_MAX_S,
                        samples.holes("backlog samples", window) + _shadow_missing(window, shadow))
    details = {
        "producer_observations": observations,
        "producer_export": None if isinstance(timings, str) else
        [None if t is None else t.isoformat() for t in (timings.start, timings.end)],
        "backlog_samples": len(sampled), "sampled_backlog_max_s": max(sampled, default=None),
        "shadow_rows": shadow.rows, "shadow_unmarked": shadow.unmarked,
        "shadow_longest_wait_s": shadow.longest_wait,
    }
    return Verdict("phase0", window, (window_criterion(window, PHASE0_WINDOW), producer, backlog), details)


@dataclass(frozen=True, slots=True)
class WorkspaceRun:
    """One phase 1 workspace over the window."""

    workspace_id: str
    on_outbox: bool                      # the rollout rule puts it on the outbox now
    outbox_events: int                   # events queued on the outbox (a live row)
    synchronous_events: int              # events sent by the synchronous path (shadow rows, no live row)
    last_synchronous: datetime | None


@dataclass(frozen=True, slots=True)
class LostEvent:
    event_id: str
    workspace_id: str
    type: str
    created_at: datetime
    statuses: tuple[str, ...]            # its live rows' statuses now


def _run_missing(run: WorkspaceRun) -> list[str]:
    what = f"workspace {run.workspace_id}"
    missing = []
    if not run.on_outbox:
        missing.append(f"{what}: not on the outbox now (rollout include, or its webhook_outbox flag)")
    if run.synchronous_events:
        when = _at(run.last_synchronous) if run.last_synchronous else "?"
        missing.append(f"{what}: {run.synchronous_events} event(s) of the window went the synchronous path, the "
                       f"last at {when}: its week on the outbox starts after that")
    if run.outbox_events == 0:
        missing.append(f"{what}: no event of the window was queued on the outbox")
    return missing


def phase1(window: Window, runs: Sequence[WorkspaceRun], lost: Sequence[LostEvent] | str) -> Verdict:
    """``lost``: the events the receiver's list lacks, or why there is no list."""
    missing = [line for run in runs for line in _run_missing(run)]
    if not runs:
        missing.append("no workspace to judge (--workspace)")
    count = None if isinstance(lost, str) else len(lost)
    if isinstance(lost, str):
        missing.append(lost)
    verdict = criterion("lost_events", "events not received by the test receiver", count, "= 0", bool(count),
                        missing)
    details = {
        "events_checked": sum(run.outbox_events for run in runs),
        "workspaces": {run.workspace_id: {"outbox_events": run.outbox_events,
                                          "synchronous_events": run.synchronous_events} for run in runs},
        "missing_events": [] if isinstance(lost, str) else [
            {"event_id": e.event_id, "workspace_id": e.workspace_id, "type": e.type,
             "created_at": e.created_at.isoformat(), "statuses": list(e.statuses)} for e in lost],
    }
    return Verdict("phase1", window, (window_criterion(window, PHASE1_WINDOW), verdict), details)


@dataclass(frozen=True, slots=True)
class RetryFigures:
    """Phase 2's base and never-retried rows, and the duplicate sends the database knows of."""

    workspaces: tuple[str, ...]
    base: int
    never_retried: int
    duplicate_sends: int
    duplicated_pairs: int                # (event, endpoint) pairs that got more than one 2xx
    excluded_types: tuple[str, ...]      # event types whose policy allows one attempt only


def phase2(window: Window, figures: RetryFigures) -> Verdict:
    rate = figures.never_retried / figures.base if figures.base else None
    missing = []
    if not figures.workspaces:
        missing.append("beta workspaces: none (the include list is empty and no --workspace was given)")
    if figures.base < NEVER_RETRIED_MIN_BASE:
        missing.append(f"deliveries: {figures.base} in the window; fewer than {NEVER_RETRIED_MIN_BASE} cannot "
                       f"show a rate under {NEVER_RETRIED_RATE:.2%}")
    verdict = criterion("never_retried_rate", "failed-and-never-retried rate", rate, f"< {NEVER_RETRIED_RATE:.2%}",
                        rate is not None and rate >= NEVER_RETRIED_RATE, missing)
    details = {
        "workspaces": list(figures.workspaces), "deliveries": figures.base, "never_retried": figures.never_retried,
        "excluded_event_types": list(figures.excluded_types),
        "duplicate_sends": figures.duplicate_sends, "events_delivered_more_than_once": figures.duplicated_pairs,
        "duplicates_note": "evidence for the RFC's 'no P1 support tickets attributable to duplicates', "
                           "which a person judges",
    }
    return Verdict("phase2", window, (window_criterion(window, None), verdict), details)


@dataclass(frozen=True, slots=True)
class RolloutState:
    percent: int
    since: datetime                      # rollout_settings.updated_at: the percentage holds since then
    workspaces_off: int                  # workspaces the rule keeps off (explicit flag off, exclude list)


@dataclass(frozen=True, slots=True)
class AlertCounts:
    in_window: int
    before: int                          # in the stretch of the same length before the window


def phase3(window: Window, rollout: RolloutState, samples: BacklogSamples, alerts: AlertCounts) -> Verdict:
    """``samples`` must reach back over the stretch before the window too (alert volume compares the two)."""
    late = rollout.percent == ROLLOUT_FULL and rollout.since > window.since
    at_full = criterion("rollout_percent", "rollout percentage", rollout.percent,
                        f"= {ROLLOUT_FULL} throughout the window", rollout.percent < ROLLOUT_FULL,
                        [f"rollout: at {ROLLOUT_FULL} % since {_at(rollout.since)}, after the window's start "
                         f"{_at(window.since)}"] if late else [])
    sampled = samples.within(window)
    p99 = percentile(sampled, 0.99)
    backlog = criterion("backlog_p99", "backlog age p99, s", p99, f"< {PHASE3_BACKLOG_P99_S:g} s",
                        p99 is not None and p99 >= PHASE3_BACKLOG_P99_S, samples.holes("backlog samples", window))
    before = window.before()
    before_holes = samples.holes("alert recording, the stretch before", before)
    # Holes in the stretch before could hide alerts there, so only a complete
    # "before" makes more alerts in the window a breach.
    volume = criterion("alert_volume", "backlog alerts fired in the window", alerts.in_window,
                       f"<= {alerts.before}, the count from {_at(before.since)} to {_at(before.until)}",
                       alerts.in_window > alerts.before and not before_holes,
                       before_holes + samples.holes("alert recording, the window", window))
    details = {"backlog_samples": len(sampled), "alerts_before": alerts.before,
               "workspaces_off_the_outbox": rollout.workspaces_off, "rollout_since": rollout.since.isoformat()}
    return Verdict("phase3", window, (window_criterion(window, PHASE3_WINDOW), at_full, backlog, volume), details)
