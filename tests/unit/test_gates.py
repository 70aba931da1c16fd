"""The rollout gates' pure verdicts (dispatcher/rules/gates.py): the RFC's criteria, over
the RFC's windows, at their boundaries, and never a pass on missing or short evidence."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.rules import gates
from dispatcher.rules.gates import (
    AlertCounts,
    BacklogSamples,
    CounterSeries,
    Histogram,
    LostEvent,
    Result,
    RetryFigures,
    RolloutState,
    ShadowRows,
    Window,
    WorkspaceRun,
)

UNTIL = datetime(2026, 9, 25, 12, 0, tzinfo=UTC)
SAMPLE_GAP = timedelta(seconds=120)   # alerts.leader_age's default


def window(length: timedelta, until: datetime = UNTIL) -> Window:
    return Window(until - length, until)


def every(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    times, t = [], start
    while t <= end:
        times.append(t)
        t += step
    return times


def samples(span: Window, age: float = 0.5, step: timedelta = timedelta(seconds=10),
            hole: tuple[datetime, datetime] | None = None, peaks: Sequence[tuple[int, float]] = ()) -> BacklogSamples:
    """A sample every ``step`` over ``span`` (none inside ``hole``), all ``age`` but the given (index, age) peaks."""
    times = [t for t in every(span.since, span.until, step) if not (hole and hole[0] < t < hole[1])]
    ages = [age] * len(times)
    for index, peak in peaks:
        ages[index] = peak
    return BacklogSamples(tuple(times), tuple(ages), SAMPLE_GAP)


def buckets_over(span: Window, fast: float, slow: float, total_per_step: float = 1000.0) -> Histogram:
    """A producer histogram over ``span``: of each step's observations, the share ``fast`` is <= 1 ms,
    ``slow`` is > 2 ms (in the 5 ms bucket), the rest in (1 ms, 2 ms]."""
    times = every(span.since, span.until, timedelta(minutes=1))
    shares = {0.001: fast, 0.002: 1 - slow, 0.005: 1.0, math.inf: 1.0}
    return gates.histogram([CounterSeries(le, tuple((t, n * total_per_step * share) for n, t in enumerate(times)))
                            for le, share in shares.items()])


def shadow_everywhere(span: Window, longest: float = 0.8) -> ShadowRows:
    hours = math.ceil(span.length / timedelta(hours=1))
    return ShadowRows(rows=hours * 100, unmarked=0, longest_wait=longest, hours=frozenset(range(hours)))


def by_name(verdict: gates.Verdict) -> dict[str, gates.Criterion]:
    return {c.name: c for c in verdict.criteria}


# ---------------------------------------------------------------- building blocks


class TestGaps:
    def test_no_sample_at_all_is_one_gap_over_the_whole_window(self) -> None:
        span = window(timedelta(hours=1))
        assert gates.gaps([], span, SAMPLE_GAP) == [(span.since, span.until)]

    def test_a_gap_of_exactly_the_limit_is_not_a_hole(self) -> None:
        span = window(timedelta(minutes=10))
        times = every(span.since, span.until, SAMPLE_GAP)
        assert times[-1] == span.until
        assert gates.gaps(times, span, SAMPLE_GAP) == []
        late = span.since + SAMPLE_GAP + timedelta(seconds=1)
        assert gates.gaps([late, *times[2:]], span, SAMPLE_GAP) == [(span.since, late)]

    def test_holes_at_the_start_in_the_middle_and_at_the_end(self) -> None:
        span = window(timedelta(hours=1))
        first, second = span.since + timedelta(minutes=5), span.since + timedelta(minutes=6)
        third = span.since + timedelta(minutes=30)
        assert gates.gaps([third, first, second], span, SAMPLE_GAP) == [
            (span.since, first), (second, third), (third, span.until)]

    def test_samples_outside_the_window_cover_nothing(self) -> None:
        span = window(timedelta(minutes=10))
        outside = [span.since - timedelta(seconds=1), span.until + timedelta(seconds=1)]
        assert gates.gaps(outside, span, SAMPLE_GAP) == [(span.since, span.until)]

    def test_many_gaps_are_named_five_then_counted(self) -> None:
        span = window(timedelta(hours=1))
        times = every(span.since, span.until, timedelta(minutes=5))
        found = gates.gaps(times, span, SAMPLE_GAP)
        lines = gates.describe_gaps("backlog samples", found, SAMPLE_GAP)
        assert len(found) == 12 and len(lines) == 6
        assert lines[-1] == "backlog samples: and 7 more gaps (35 min in all)"


def test_percentile_interpolates_like_percentile_cont() -> None:
    assert gates.percentile([], 0.99) is None
    assert gates.percentile([7.0], 0.99) == 7.0
    assert gates.percentile(list(map(float, range(101))), 0.99) == pytest.approx(99.0)
    assert gates.percentile([0.0, 10.0], 0.99) == pytest.approx(9.9)


class TestHistogram:
    T0 = datetime(2026, 9, 22, tzinfo=UTC)

    def at(self, minutes: float) -> datetime:
        return self.T0 + timedelta(minutes=minutes)

    def test_a_counter_reset_counts_the_new_value_whole(self) -> None:
        series = CounterSeries(math.inf, ((self.at(0), 100.0), (self.at(1), 150.0), (self.at(2), 20.0),
                                          (self.at(3), 30.0)))
        found = gates.histogram([series])
        assert found.buckets == ((math.inf, 80.0),)
        assert (found.start, found.end, found.lost) == (self.at(0), self.at(3), ())

    def test_a_reset_after_a_long_silence_lost_observations(self) -> None:
        series = CounterSeries(math.inf, ((self.at(0), 100.0), (self.at(6), 5.0)))
        assert gates.histogram([series]).lost == ((self.at(0), self.at(6)),)
        no_reset = CounterSeries(math.inf, ((self.at(0), 100.0), (self.at(600), 500.0)))
        assert gates.histogram([no_reset]).lost == ()

    def test_series_of_one_bound_add_up_and_buckets_never_shrink(self) -> None:
        pts = lambda a, b: ((self.at(0), 0.0), (self.at(1), float(b - a)))  # noqa: E731
        found = gates.histogram([CounterSeries(0.001, pts(0, 40)), CounterSeries(0.001, pts(0, 50)),
                                 CounterSeries(0.002, pts(0, 80)), CounterSeries(math.inf, pts(0, 100))])
        assert found.buckets == ((0.001, 90.0), (0.002, 90.0), (math.inf, 100.0))

    @pytest.mark.parametrize(("buckets", "expected"), [
        (((0.001, 50.0), (0.002, 100.0), (math.inf, 100.0)), 0.001 + 0.001 * (99 - 50) / 50),
        (((0.001, 99.0), (0.002, 100.0), (math.inf, 100.0)), 0.001),          # rank 99 is the bucket's top
        (((0.001, 0.0), (0.002, 99.0), (0.005, 100.0), (math.inf, 100.0)), 0.002),   # exactly 2 ms
        (((0.001, 10.0), (math.inf, 100.0)), 0.001),                          # in +Inf: the highest finite bound
        (((0.001, 100.0), (math.inf, 100.0)), 0.001 * 0.99),                  # the first bucket starts at 0
        (((0.001, 0.0), (math.inf, 0.0)), None),                              # no observation
        (((0.001, 5.0), (0.002, 10.0)), None),                                # no +Inf bucket
    ])
    def test_quantile_as_prometheus(self, buckets: tuple[tuple[float, float], ...], expected: float | None) -> None:
        found = gates.histogram_quantile(0.99, buckets)
        assert found == (None if expected is None else pytest.approx(expected))


# ---------------------------------------------------------------- phase 0


class TestPhase0:
    SPAN = window(gates.PHASE0_WINDOW)

    def verdict(self, span: Window = SPAN, timings: Histogram | str | None = None,
                backlog: BacklogSamples | None = None, shadow: ShadowRows | None = None) -> gates.Verdict:
        return gates.phase0(span, buckets_over(self.SPAN, fast=0.9, slow=0.005) if timings is None else timings,
                            samples(self.SPAN) if backlog is None else backlog,
                            shadow_everywhere(self.SPAN) if shadow is None else shadow)

    def test_seventy_two_hours_of_evidence_within_the_limits_pass(self) -> None:
        verdict = self.verdict()
        assert verdict.result is Result.PASS, verdict.missing
        found = by_name(verdict)
        assert found["producer_p99"].value < 0.002
        assert found["dry_run_backlog_max"].value == 0.8   # the longest shadow wait beats the sampled 0.5

    def test_without_the_producer_timings_it_is_incomplete_and_says_so(self) -> None:
        verdict = self.verdict(timings="producer timings: no --producer-timings FILE given")
        assert verdict.result is Result.INCOMPLETE
        assert verdict.missing == ("producer timings: no --producer-timings FILE given",)

    def test_one_shadow_row_a_minute_ago_is_incomplete(self) -> None:
        recent = Window(UNTIL - timedelta(minutes=1), UNTIL)
        verdict = self.verdict(backlog=samples(recent), shadow=ShadowRows(1, 0, 0.5, frozenset({71})))
        assert verdict.result is Result.INCOMPLETE
        assert any(line.startswith("backlog samples: nothing from 2026-09-22 12:00:00+00:00 to")
                   for line in verdict.missing), verdict.missing
        assert any("shadow rows: none written from 2026-09-22 12:00:00+00:00 to 2026-09-25 11:00:00+00:00" in line
                   for line in verdict.missing), verdict.missing

    def test_a_window_shorter_than_72_hours_is_incomplete(self) -> None:
        short = window(gates.PHASE0_WINDOW - timedelta(seconds=1))
        verdict = self.verdict(span=short)
        assert verdict.result is Result.INCOMPLETE
        assert by_name(verdict)["window"].result is Result.INCOMPLETE
        assert by_name(verdict)["producer_p99"].result is Result.PASS

    def test_a_coverage_gap_in_the_samples_is_incomplete(self) -> None:
        hole = (self.SPAN.since + timedelta(hours=30), self.SPAN.since + timedelta(hours=31))
        verdict = self.verdict(backlog=samples(self.SPAN, hole=hole))
        assert verdict.result is Result.INCOMPLETE
        assert len(verdict.missing) == 1 and verdict.missing[0].startswith(
            "backlog samples: nothing from 2026-09-23 18:00:00+00:00 to 2026-09-23 19:00:00+00:00 (1 h;")

    def test_an_hour_without_shadow_rows_is_incomplete(self) -> None:
        shadow = shadow_everywhere(self.SPAN)
        verdict = self.verdict(shadow=ShadowRows(shadow.rows, 0, 0.8, shadow.hours - {40, 41}))
        assert verdict.result is Result.INCOMPLETE
        assert verdict.missing == ("shadow rows: none written from 2026-09-24 04:00:00+00:00 to 2026-09-24 "
                                   "06:00:00+00:00: the dry run must run throughout (a shadow row in every hour)",)

    @pytest.mark.parametrize(("age", "result"), [(4.999, Result.PASS), (5.0, Result.FAIL), (7.0, Result.FAIL)])
    def test_the_backlog_maximum_not_a_percentile(self, age: float, result: Result) -> None:
        # One sample in 25,920 over the limit: a p99 would not see it, the maximum does.
        verdict = self.verdict(backlog=samples(self.SPAN, peaks=[(1000, age)]))
        assert verdict.result is result
        assert by_name(verdict)["dry_run_backlog_max"].value == max(age, 0.8)

    def test_a_slow_shadow_row_between_samples_fails(self) -> None:
        verdict = self.verdict(shadow=shadow_everywhere(self.SPAN, longest=5.2))
        assert verdict.result is Result.FAIL

    def test_a_breach_seen_fails_even_with_evidence_missing(self) -> None:
        hole = (self.SPAN.since + timedelta(hours=1), self.SPAN.since + timedelta(hours=2))
        verdict = self.verdict(timings="producer timings: missing", backlog=samples(self.SPAN, hole=hole, age=6.0))
        assert verdict.result is Result.FAIL
        assert len(verdict.missing) == 2

    @pytest.mark.parametrize(("slow", "result"), [(0.009, Result.PASS), (0.01, Result.FAIL), (0.02, Result.FAIL)])
    def test_producer_p99_at_the_boundary(self, slow: float, result: Result) -> None:
        # 1 % over 2 ms puts the p99 at exactly 2 ms: "under 2 ms" fails.
        verdict = self.verdict(timings=buckets_over(self.SPAN, fast=0.5, slow=slow))
        assert by_name(verdict)["producer_p99"].result is result

    def test_an_export_that_starts_late_or_ends_early_is_incomplete(self) -> None:
        late = Window(self.SPAN.since + timedelta(minutes=6), self.SPAN.until)
        early = Window(self.SPAN.since, self.SPAN.until - timedelta(minutes=6))
        on_time = Window(self.SPAN.since + timedelta(minutes=5), self.SPAN.until - timedelta(minutes=5))
        for span, missing in ((late, "starts"), (early, "ends"), (on_time, None)):
            found = by_name(self.verdict(timings=buckets_over(span, fast=0.9, slow=0.0)))["producer_p99"]
            if missing is None:
                assert found.result is Result.PASS, found.missing
            else:
                assert found.result is Result.INCOMPLETE and missing in found.missing[0]

    def test_an_instant_export_is_incomplete(self) -> None:
        instant = gates.histogram([CounterSeries(math.inf, ((UNTIL, 1e6),)), CounterSeries(0.001, ((UNTIL, 1e6),))])
        found = by_name(self.verdict(timings=instant))["producer_p99"]
        assert found.result is Result.INCOMPLETE and found.value is None
        assert "starts 2026-09-25 12:00:00+00:00, after the window's start" in found.missing[0]


# ---------------------------------------------------------------- phase 1


class TestPhase1:
    SPAN = window(gates.PHASE1_WINDOW)
    GOOD = WorkspaceRun("larkspur-ops", True, 500, 0, None)
    LOST = LostEvent("e7", "larkspur-ops", "job.created", UNTIL - timedelta(days=2), ("dead",))

    def test_every_event_received_over_a_week_passes(self) -> None:
        verdict = gates.phase1(self.SPAN, [self.GOOD], [])
        assert verdict.result is Result.PASS and by_name(verdict)["lost_events"].value == 0

    def test_one_lost_event_fails_and_is_named(self) -> None:
        verdict = gates.phase1(self.SPAN, [self.GOOD], [self.LOST])
        assert verdict.result is Result.FAIL
        assert verdict.details["missing_events"][0]["event_id"] == "e7"

    def test_without_the_receivers_list_it_is_incomplete(self) -> None:
        verdict = gates.phase1(self.SPAN, [self.GOOD], "received ids: no --received FILE given")
        assert (verdict.result, verdict.missing) == (Result.INCOMPLETE, ("received ids: no --received FILE given",))

    def test_less_than_a_week_is_incomplete(self) -> None:
        verdict = gates.phase1(window(gates.PHASE1_WINDOW - timedelta(minutes=1)), [self.GOOD], [])
        assert verdict.result is Result.INCOMPLETE and verdict.missing[0].startswith("window: 6 d 23 h")

    @pytest.mark.parametrize(("run", "words"), [
        (WorkspaceRun("larkspur-ops", False, 500, 0, None), "not on the outbox now"),
        (WorkspaceRun("larkspur-ops", True, 500, 3, UNTIL - timedelta(days=2)),
         "3 event(s) of the window went the synchronous path, the last at 2026-09-23 12:00:00+00:00"),
        (WorkspaceRun("larkspur-ops", True, 0, 0, None), "no event of the window was queued on the outbox"),
    ])
    def test_a_workspace_not_on_the_outbox_all_week_is_incomplete(self, run: WorkspaceRun, words: str) -> None:
        verdict = gates.phase1(self.SPAN, [self.GOOD, run], [])
        assert verdict.result is Result.INCOMPLETE
        assert verdict.missing == (f"workspace larkspur-ops: {words}" + verdict.missing[0].split(words, 1)[1],)

    def test_nothing_to_judge_is_incomplete(self) -> None:
        assert gates.phase1(self.SPAN, [], []).result is Result.INCOMPLETE


# ---------------------------------------------------------------- phase 2


class TestPhase2:
    SPAN = window(timedelta(days=7))

    def figures(self, base: int, never: int, workspaces: tuple[str, ...] = ("beta-1",), dup: int = 0) -> RetryFigures:
        return RetryFigures(workspaces, base, never, dup, dup, ("technician.location",))

    @pytest.mark.parametrize(("base", "never", "result"), [
        (2000, 0, Result.PASS),
        (2001, 1, Result.PASS),          # 0.04998 %
        (2000, 1, Result.FAIL),          # 0.05 % is not below 0.05 %
        (1999, 0, Result.INCOMPLETE),    # too few to show the rate
        (100, 1, Result.FAIL),           # a breach seen fails, however few
        (0, 0, Result.INCOMPLETE),
    ])
    def test_the_rate_at_its_boundary(self, base: int, never: int, result: Result) -> None:
        assert gates.phase2(self.SPAN, self.figures(base, never)).result is result

    def test_no_beta_workspace_is_incomplete(self) -> None:
        verdict = gates.phase2(self.SPAN, self.figures(0, 0, workspaces=()))
        assert verdict.result is Result.INCOMPLETE and verdict.missing[0].startswith("beta workspaces: none")

    def test_duplicates_are_evidence_not_a_verdict(self) -> None:
        verdict = gates.phase2(self.SPAN, self.figures(5000, 0, dup=40))
        assert verdict.result is Result.PASS
        assert verdict.details["duplicate_sends"] == 40 and "a person" in verdict.details["duplicates_note"]


# ---------------------------------------------------------------- phase 3


class TestPhase3:
    SPAN = window(gates.PHASE3_WINDOW)
    BOTH = Window(SPAN.since - SPAN.length, SPAN.until)
    FULL = RolloutState(100, SPAN.since - timedelta(hours=1), 0)
    SOME_ALERTS = AlertCounts(2, 2)

    def verdict(self, rollout: RolloutState = FULL, backlog: BacklogSamples | None = None,
                alerts: AlertCounts = SOME_ALERTS, span: Window = SPAN) -> gates.Verdict:
        return gates.phase3(span, rollout, samples(self.BOTH, step=timedelta(minutes=1)) if backlog is None
                            else backlog, alerts)

    def test_a_week_at_100_percent_within_the_limits_passes(self) -> None:
        verdict = self.verdict()
        assert verdict.result is Result.PASS, verdict.missing

    def test_one_percent_fails(self) -> None:
        verdict = self.verdict(rollout=RolloutState(1, self.SPAN.since - timedelta(days=30), 0))
        assert verdict.result is Result.FAIL and by_name(verdict)["rollout_percent"].result is Result.FAIL

    def test_at_100_percent_for_less_than_the_window_is_incomplete(self) -> None:
        verdict = self.verdict(rollout=RolloutState(100, self.SPAN.since + timedelta(seconds=1), 0))
        assert verdict.result is Result.INCOMPLETE
        assert verdict.missing[0].startswith("rollout: at 100 % since 2026-09-18 12:00:01+00:00")

    @pytest.mark.parametrize(("slow_share", "result"), [(0.009, Result.PASS), (0.011, Result.FAIL)])
    def test_backlog_p99(self, slow_share: float, result: Result) -> None:
        backlog = samples(self.BOTH, step=timedelta(minutes=1))
        inside = [i for i, t in enumerate(backlog.times) if t >= self.SPAN.since]
        peaks = [(i, 40.0) for i in inside[:int(len(inside) * slow_share)]]
        found = self.verdict(backlog=samples(self.BOTH, step=timedelta(minutes=1), peaks=peaks))
        assert by_name(found)["backlog_p99"].result is result

    @pytest.mark.parametrize(("now", "before", "result"), [
        (2, 2, Result.PASS), (0, 0, Result.PASS), (1, 3, Result.PASS), (3, 2, Result.FAIL)])
    def test_alert_volume_against_the_week_before(self, now: int, before: int, result: Result) -> None:
        assert by_name(self.verdict(alerts=AlertCounts(now, before)))["alert_volume"].result is result

    def test_a_week_before_nobody_recorded_cannot_be_compared(self) -> None:
        only_window = samples(self.SPAN, step=timedelta(minutes=1))
        for alerts in (AlertCounts(0, 0), AlertCounts(3, 0)):
            verdict = self.verdict(backlog=only_window, alerts=alerts)
            assert by_name(verdict)["alert_volume"].result is Result.INCOMPLETE
            assert verdict.missing[0].startswith("alert recording, the stretch before: nothing from "
                                                 "2026-09-11 12:00:00+00:00 to 2026-09-18 12:00:00+00:00")

    def test_a_gap_in_the_window_is_incomplete(self) -> None:
        hole = (self.SPAN.since + timedelta(days=3), self.SPAN.since + timedelta(days=3, minutes=3))
        verdict = self.verdict(backlog=samples(self.BOTH, step=timedelta(minutes=1), hole=hole))
        assert verdict.result is Result.INCOMPLETE
        assert {c.name for c in verdict.criteria if c.result is Result.INCOMPLETE} == {"backlog_p99", "alert_volume"}

    def test_less_than_a_week_is_incomplete(self) -> None:
        short = window(gates.PHASE3_WINDOW - timedelta(hours=1))
        verdict = self.verdict(span=short, rollout=RolloutState(100, short.since - timedelta(days=1), 0))
        assert verdict.result is Result.INCOMPLETE and by_name(verdict)["window"].result is Result.INCOMPLETE
