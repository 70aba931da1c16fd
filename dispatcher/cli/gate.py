"""``dispatcher -c CFG gate phase0|phase1|phase2|phase3``: RFC-014's rollout gates, from the database.

Each report prints its figure, the threshold and PASS/FAIL, and the command
exits non-zero when the gate fails (docs/rollout.md defines every figure).
A gate with no data to judge fails: absence of evidence is not a pass.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dispatcher import store
from dispatcher.config import Config
from dispatcher.durations import DurationError, parse_duration
from dispatcher.runtime.embedded import resolve_dsn
from dispatcher.runtime.exitcodes import ExitCode, UsageError
from dispatcher.store.rollout import gate_figures

PHASE0_BACKLOG_P99_S = 5.0
PHASE2_NEVER_RETRIED_RATE = 0.0005  # 0.05 %
PHASE3_BACKLOG_P99_S = 15.0
_DEFAULT_SINCE = {"phase0": "72h", "phase1": "7d", "phase2": "7d", "phase3": "7d"}


@dataclass
class Report:
    gate: str
    figure: str
    value: float | int | None
    threshold: str
    passed: bool
    details: dict[str, Any] = field(default_factory=dict)


def add_parser(commands: Any) -> None:
    gate = commands.add_parser("gate", help="compute an RFC rollout gate; exits 1 when it fails")
    gate.add_argument("phase", choices=("phase0", "phase1", "phase2", "phase3"))
    gate.add_argument("--since", help="window start: 72h, 7d, ... ago, or an ISO time (default per phase)")
    gate.add_argument("--until", help="phase1: window end, ISO time (default: now)")
    gate.add_argument("--workspace", action="append", default=[], help="repeatable; phase1 requires it")
    gate.add_argument("--received", type=Path, help="phase1: event ids the test receiver got, one per line")
    gate.add_argument("--json", action="store_true")


def _usage(message: str) -> Exception:
    return UsageError(message)


def parse_when(text: str, now: datetime) -> datetime:
    """A duration ago (``72h``, ``dispatcher.durations``) or an ISO 8601 time (UTC when it names no zone)."""
    try:
        ago = parse_duration(text)
    except DurationError:
        pass
    else:
        try:
            return now - timedelta(seconds=ago)
        except OverflowError:
            raise _usage(f"{text!r} ago is before the year 1") from None
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise _usage(f"{text!r} is neither a duration ago (72h, 7d) nor an ISO time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def cmd_gate(config: Config, args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    params: dict[str, Any] = {"since": parse_when(args.since or _DEFAULT_SINCE[args.phase], now),
                              "workspaces": args.workspace or None}
    if args.phase == "phase1":
        params.update(until=parse_when(args.until, now) if args.until else now, received=_received(args))
    conn = store.connect(resolve_dsn(config.database), config.database.connect_timeout, "dispatcher-gate")
    if args.phase == "phase0":
        report = phase0(conn, params)
    elif args.phase == "phase1":
        report = phase1(conn, params)
    elif args.phase == "phase2":
        report = phase2(conn, params, _single_attempt_types(config))
    else:
        report = phase3(conn, params)
    report.details["since"] = params["since"].isoformat()
    _print(report, args.json)
    return ExitCode.OK if report.passed else ExitCode.FAILURE


def _received(args: argparse.Namespace) -> list[str]:
    if not args.workspace:
        raise _usage("gate phase1 needs --workspace (repeatable): the workspaces whose events are compared")
    if args.received is None:
        raise _usage("gate phase1 needs --received FILE: the event ids the test receiver got, one per line")
    try:
        text = args.received.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _usage(f"cannot read --received {args.received}: {getattr(exc, 'strerror', None) or exc}") from None
    return sorted({line.strip() for line in text.splitlines() if line.strip()})


def _single_attempt_types(config: Config) -> list[str]:
    policies = config.retry.retry_policies()
    return sorted(t for t, p in policies.by_event_type.items() if p.max_attempts == 1)


def phase0(conn: store.Connection, params: dict[str, Any]) -> Report:
    (row,) = gate_figures(conn, "gate_phase0", params)
    p99 = _seconds(row["p99_seconds"])
    passed = row["rows"] > 0 and p99 is not None and p99 < PHASE0_BACKLOG_P99_S
    return Report("phase0", "dry-run backlog age p99 (shadow row created -> marked), s", p99,
                  f"< {PHASE0_BACKLOG_P99_S:g} s", passed,
                  {"shadow_rows": row["rows"], "unmarked": row["unmarked"],
                   "producer_p99": "read the statsd histogram webhook_producer_outbox_write_seconds "
                                   "(p99 < 2 ms; docs/metrics.md)"})


def phase1(conn: store.Connection, params: dict[str, Any]) -> Report:
    missing = gate_figures(conn, "gate_phase1_missing", params)
    (checked,) = gate_figures(conn, "gate_phase1_checked", params)
    events = int(checked["count"])
    lost = [{"event_id": r["id"], "workspace_id": r["workspace_id"], "type": r["type"],
             "created_at": r["created_at"].isoformat()} for r in missing]
    return Report("phase1", "events not received by the test receiver", len(lost), "= 0",
                  events > 0 and not lost,
                  {"events_checked": events, "received_ids": len(params["received"]), "missing": lost})


def phase2(conn: store.Connection, params: dict[str, Any], single_attempt_types: list[str]) -> Report:
    query = {**params, "single_attempt_types": single_attempt_types}
    (row,) = gate_figures(conn, "gate_phase2", query)
    (dup,) = gate_figures(conn, "gate_phase2_duplicates", params)
    total, never = int(row["deliveries"]), int(row["never_retried"])
    rate = never / total if total else None
    return Report("phase2", "failed-and-never-retried rate", rate, f"< {PHASE2_NEVER_RETRIED_RATE:.2%}",
                  rate is not None and rate < PHASE2_NEVER_RETRIED_RATE,
                  {"deliveries": total, "never_retried": never, "excluded_event_types": single_attempt_types,
                   "duplicate_sends": int(dup["duplicates"]), "events_delivered_more_than_once": int(dup["events"])})


def phase3(conn: store.Connection, params: dict[str, Any]) -> Report:
    (row,) = gate_figures(conn, "gate_phase3", params)
    p99 = _seconds(row["p99_seconds"])
    passed = row["rows"] > 0 and p99 is not None and p99 < PHASE3_BACKLOG_P99_S
    return Report("phase3", "backlog age p99 (due -> first attempt), s", p99, f"< {PHASE3_BACKLOG_P99_S:g} s",
                  passed, {"live_rows": row["rows"], "not_attempted_yet": row["unattempted"]})


def _seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _print(report: Report, as_json: bool) -> None:
    if as_json:
        print(json.dumps(asdict(report), default=str, sort_keys=True))
        return
    value = "no data" if report.value is None else (
        f"{report.value:.4%}" if report.gate == "phase2" else f"{report.value}")
    print(f"{report.gate}: {report.figure}: {value} (threshold {report.threshold}) "
          f"{'PASS' if report.passed else 'FAIL'}")
    for key, detail in report.details.items():
        if key == "missing":
            for event in detail:
                print(f"  missing: {event['event_id']} workspace={event['workspace_id']} type={event['type']} "
                      f"created_at={event['created_at']}")
        else:
            print(f"  {key}: {detail}")
