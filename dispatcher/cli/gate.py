"""``dispatcher -c CFG gate phase0|phase1|phase2|phase3``: RFC-014's rollout gates.

This module gathers the evidence (the database through ``store.rollout``, the
files the operator exports) and ``dispatcher.rules.gates`` judges it by the
RFC's own criteria over the RFC's own window (docs/rollout.md defines every
figure).  Each report names every criterion with its figure, threshold and
result, and every missing piece of evidence.  Exit codes: 0 the gate passes,
1 it fails, 3 it is incomplete (missing or too-short evidence is never a pass;
an unreachable database is incomplete too), 2 bad input, 6 the schema lacks a
migration.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dispatcher import store
from dispatcher.cli.timings import TimingsError, read_timings
from dispatcher.config import Config
from dispatcher.durations import DurationError, parse_duration
from dispatcher.rules import gates
from dispatcher.rules.gates import Histogram, Result, Verdict, Window
from dispatcher.runtime.embedded import resolve_dsn
from dispatcher.runtime.exitcodes import ExitCode, UsageError
from dispatcher.store import rollout as rollout_store

PHASES = ("phase0", "phase1", "phase2", "phase3")
# The window when --since is not given: the RFC's own (phase 2 names none).
DEFAULT_LENGTH = {"phase0": gates.PHASE0_WINDOW, "phase1": gates.PHASE1_WINDOW,
                  "phase2": gates.PHASE2_DEFAULT_WINDOW, "phase3": gates.PHASE3_WINDOW}
EXIT = {Result.PASS: ExitCode.OK, Result.FAIL: ExitCode.FAILURE, Result.INCOMPLETE: ExitCode.INCOMPLETE}
# Which phases each evidence option belongs to.
OPTION_PHASES = {"workspace": ("phase1", "phase2"), "received": ("phase1",), "producer_timings": ("phase0",)}

Judge = Callable[[store.Connection, Config, argparse.Namespace, Window], Verdict]


def add_parser(commands: Any) -> None:
    gate = commands.add_parser("gate", help="judge an RFC rollout gate: exits 0 pass, 1 fail, 3 incomplete")
    gate.add_argument("phase", choices=PHASES)
    gate.add_argument("--since", help="window start: an ISO time, or a duration (72h, 7d) before --until "
                                      "(default: the RFC's window, 72h for phase0, 7d for the others)")
    gate.add_argument("--until", help="window end: an ISO time, or a duration ago (default: now)")
    gate.add_argument("--workspace", action="append", default=[],
                      help="repeatable; phase1: the workspaces compared (required); "
                           "phase2: the beta workspaces (default: the include list)")
    gate.add_argument("--received", type=Path, help="phase1: the event ids the test receiver got, one per line")
    gate.add_argument("--producer-timings", type=Path, metavar="FILE",
                      help="phase0: the producers' webhook_producer_outbox_write_seconds histogram, a Prometheus "
                           "API response or a statsd_exporter dump (docs/rollout.md, \"Producer timings\")")
    gate.add_argument("--json", action="store_true")


def parse_when(text: str, now: datetime) -> datetime:
    """A duration before ``now`` (``72h``, ``dispatcher.durations``) or an ISO 8601 time (UTC when it names no zone)."""
    try:
        ago = parse_duration(text)
    except DurationError:
        pass
    else:
        try:
            return now - timedelta(seconds=ago)
        except OverflowError:
            raise UsageError(f"{text!r} ago is before the year 1") from None
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"{text!r} is neither a duration ago (72h, 7d) nor an ISO time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def window_of(phase: str, since: str | None, until: str | None, now: datetime) -> Window:
    end = parse_when(until, now) if until else now
    start = parse_when(since, end) if since else end - DEFAULT_LENGTH[phase]
    if start >= end:
        raise UsageError(f"the window is empty: it starts {start.isoformat()}, not before its end {end.isoformat()}")
    return Window(start, end)


def _check_options(args: argparse.Namespace) -> None:
    for option, phases in OPTION_PHASES.items():
        if getattr(args, option) and args.phase not in phases:
            flag = "--" + option.replace("_", "-")
            raise UsageError(f"{flag} applies to gate {' and '.join(phases)}, not {args.phase}")
    if args.phase == "phase1" and not args.workspace:
        raise UsageError("gate phase1 needs --workspace (repeatable): the workspaces whose events are compared")


def cmd_gate(config: Config, args: argparse.Namespace) -> int:
    _check_options(args)
    window = window_of(args.phase, args.since, args.until, datetime.now(UTC))
    conn = store.connect(resolve_dsn(config.database), config.database.connect_timeout, "dispatcher-gate")
    try:
        missing = store.pending_migrations(conn)
        if missing:
            raise store.SchemaOutdated(f"database schema is missing migration(s) {missing}; "
                                       f"run: dispatcher -c {args.config} migrate")
        verdict = JUDGES[args.phase](conn, config, args, window)
    except store.NotFound as exc:
        raise UsageError(str(exc)) from None
    finally:
        conn.close()
    _print(verdict, args.json)
    return EXIT[verdict.result]


# ---------------------------------------------------------------- the evidence, per phase


def _sample_gap(config: Config) -> timedelta:
    """Longer than this without a backlog sample, no upkeep leader ran: ``dispatcher check``'s own limit."""
    return timedelta(seconds=config.alerts.leader_age)


def producer_timings(path: Path | None) -> Histogram | str:
    """The exported histogram, or the line naming why there is none."""
    if path is None:
        return "producer timings: no --producer-timings FILE given (docs/rollout.md, \"Producer timings\")"
    try:
        return gates.histogram(read_timings(path))
    except TimingsError as exc:
        return f"producer timings: {path}: {exc}"


def received_ids(path: Path | None) -> list[str] | str:
    """The receiver's event ids, or the line naming why there are none."""
    if path is None:
        return "received ids: no --received FILE given (the test receiver's event ids, one per line)"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"received ids: cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
    return sorted({line.strip() for line in text.splitlines() if line.strip()})


def _phase0(conn: store.Connection, config: Config, args: argparse.Namespace, window: Window) -> Verdict:
    return gates.phase0(window, producer_timings(args.producer_timings),
                        rollout_store.backlog_samples(conn, window, _sample_gap(config)),
                        rollout_store.shadow_rows(conn, window))


def _phase1(conn: store.Connection, config: Config, args: argparse.Namespace, window: Window) -> Verdict:
    runs = rollout_store.workspace_runs(conn, window, args.workspace)
    received = received_ids(args.received)
    lost = received if isinstance(received, str) else rollout_store.lost_events(
        conn, window, [run.workspace_id for run in runs], received)
    return gates.phase1(window, runs, lost)


def _single_attempt_types(config: Config) -> list[str]:
    policies = config.retry.retry_policies()
    return sorted(t for t, p in policies.by_event_type.items() if p.max_attempts == 1)


def _phase2(conn: store.Connection, config: Config, args: argparse.Namespace, window: Window) -> Verdict:
    workspaces = sorted(set(args.workspace)) or rollout_store.include_list(conn)
    return gates.phase2(window, rollout_store.retry_figures(conn, window, workspaces, _single_attempt_types(config)))


def _phase3(conn: store.Connection, config: Config, args: argparse.Namespace, window: Window) -> Verdict:
    both_weeks = Window(window.before().since, window.until)
    return gates.phase3(window, rollout_store.rollout_state(conn),
                        rollout_store.backlog_samples(conn, both_weeks, _sample_gap(config)),
                        rollout_store.alert_counts(conn, window))


JUDGES: dict[str, Judge] = {"phase0": _phase0, "phase1": _phase1, "phase2": _phase2, "phase3": _phase3}


# ---------------------------------------------------------------- the report


def document(verdict: Verdict) -> dict[str, Any]:
    """The report as ``--json`` prints it."""
    return {
        "gate": verdict.gate, "verdict": verdict.result.value, "passed": verdict.result is Result.PASS,
        "window": {"since": verdict.window.since.isoformat(), "until": verdict.window.until.isoformat()},
        "criteria": [{"name": c.name, "figure": c.figure, "value": c.value, "threshold": c.threshold,
                      "result": c.result.value, "missing": list(c.missing)} for c in verdict.criteria],
        "missing": list(verdict.missing), "details": dict(verdict.details),
    }


def _shown(name: str, value: float | int | None) -> str:
    if value is None:
        return "no data"
    if name == "never_retried_rate":
        return f"{value:.4%}"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _print(verdict: Verdict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(document(verdict), default=str, sort_keys=True))
        return
    print(f"gate {verdict.gate}: {verdict.result.value.upper()} "
          f"(window {verdict.window.since.isoformat()} to {verdict.window.until.isoformat()})")
    for c in verdict.criteria:
        print(f"  {c.result.value.upper():<10} {c.figure}: {_shown(c.name, c.value)} (needs {c.threshold})")
    for line in verdict.missing:
        print(f"  missing: {line}")
    for key, detail in verdict.details.items():
        if key == "missing_events":
            for event in detail:
                print(f"  lost: {event['event_id']} workspace={event['workspace_id']} type={event['type']} "
                      f"created_at={event['created_at']} status={','.join(event['statuses'])}")
        else:
            print(f"  {key}: {detail}")
