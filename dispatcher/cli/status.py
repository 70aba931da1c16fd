"""``dispatcher status`` and ``dispatcher check``: the region, read from the database.

Both read the database directly, never a dispatcher process, so they answer
the same whether the fleet is healthy, stuck or gone:

* ``status`` -- one screen (fits 100 columns) or ``--json`` (a stable,
  versioned document, docs/operations.md);
* ``check`` -- a probe for external monitoring with Nagios exit codes, judged
  by the rules of ``dispatcher.rules.health`` (the upkeep leader's alert uses the
  same backlog rule on the same query).  Any failure to evaluate -- bad
  config, database unreachable, a bug -- is UNKNOWN (3) on one line, never a
  traceback, so the monitoring system never mistakes a broken probe for a verdict.
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Mapping
from typing import Any

from dispatcher import store
from dispatcher.config import Config, load_config
from dispatcher.rules.health import BacklogFigures, FleetFigures, Severity, Verdict, judge
from dispatcher.runtime.embedded import resolve_dsn
from dispatcher.store.operations import Thresholds, health_figures, region_status

# Every read runs under a statement timeout: a probe that hangs on a struggling
# database is worse than one that says UNKNOWN.  check's reads are bounded
# (27 ms median with 2 M rows a day, 500 k pending); status counts the last
# day's rows, measured at 0.9 s per 2 M rows, so it gets room for a full
# 25 M-row day (docs/operations.md).
CHECK_TIMEOUT = 10.0
STATUS_TIMEOUT = 60.0
JSON_VERSION = 1
WIDTH = 100


def thresholds(config: Config, timeout: float = CHECK_TIMEOUT) -> Thresholds:
    return Thresholds(region=config.region, backlog=config.alerts.backlog_rule(),
                      heartbeat_age=config.alerts.heartbeat_age, leader_age=config.alerts.leader_age,
                      timeout=timeout)


def _connect(config: Config, purpose: str) -> store.Connection:
    return store.connect(resolve_dsn(config.database), config.database.connect_timeout, f"dispatcher-{purpose}")


# ---------------------------------------------------------------- check


def _perfdata(backlog: BacklogFigures, fleet: FleetFigures, ahead: Mapping[str, int]) -> str:
    """Nagios performance data: the figures behind the verdict."""
    return (f"overdue_rows={backlog.overdue_rows} oldest_due_age={backlog.oldest_age or 0.0:.1f}s "
            f"held_rows={backlog.held_rows} open_breakers={backlog.open_breakers} "
            f"workers_alive={fleet.workers_alive} heartbeat_age={_age(fleet.heartbeat_age)} "
            f"leader_age={_age(fleet.leader_age)} partitions_ahead_days={min(ahead.values(), default=0)}")


def _age(seconds: float | None) -> str:
    return "U" if seconds is None else f"{seconds:.1f}s"  # U: Nagios' "no value"


def _check_document(verdict: Verdict, backlog: BacklogFigures | None, fleet: FleetFigures | None,
                    ahead: Mapping[str, int] | None) -> dict[str, Any]:
    return {"version": JSON_VERSION, "status": verdict.severity.name, "code": int(verdict.severity),
            "problems": list(verdict.problems),
            "backlog": None if backlog is None else {
                "overdue_rows": backlog.overdue_rows, "oldest_due_age": backlog.oldest_age,
                "held_rows": backlog.held_rows, "open_breakers": backlog.open_breakers},
            "fleet": None if fleet is None else {
                "workers_alive": fleet.workers_alive, "heartbeat_age": fleet.heartbeat_age,
                "leader_age": fleet.leader_age, "stopped_age": fleet.stopped_age, "stopped_how": fleet.stopped_how,
                "rows_waiting": fleet.rows_waiting},
            "partitions": None if ahead is None else {"days_ahead": dict(ahead)}}


Evaluation = tuple[Verdict, BacklogFigures | None, FleetFigures | None, Mapping[str, int] | None]


def _evaluate(config_path: str) -> Evaluation:
    try:
        config = load_config(config_path)
        conn = _connect(config, "check")
        try:
            backlog, fleet, ahead = health_figures(conn, thresholds(config))
        finally:
            conn.close()
    except Exception as exc:  # config, database, anything: the probe cannot judge -> UNKNOWN, one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Verdict(Severity.UNKNOWN, (f"cannot evaluate: {first}",)), None, None, None
    verdict = judge(backlog, fleet, config.alerts.backlog_rule(), config.alerts.fleet_rule(), ahead)
    return verdict, backlog, fleet, ahead


def check_main(config_path: str, as_json: bool) -> int:
    """``dispatcher check``: print one line (or JSON) and return the Nagios code."""
    verdict, backlog, fleet, ahead = _evaluate(config_path)
    if as_json:
        print(json.dumps(_check_document(verdict, backlog, fleet, ahead), sort_keys=True))
    else:
        summary = "; ".join(verdict.problems) or _healthy_summary(backlog, fleet)
        perf = (f" | {_perfdata(backlog, fleet, ahead)}"
                if backlog is not None and fleet is not None and ahead is not None else "")
        print(f"{verdict.severity.name} - {summary}{perf}")
    return int(verdict.severity)


def _healthy_summary(backlog: BacklogFigures | None, fleet: FleetFigures | None) -> str:
    if backlog is None or fleet is None:
        return "no figures"
    held = f", {backlog.held_rows} due rows held by {backlog.open_breakers} breakers" if backlog.held_rows else ""
    return f"{fleet.workers_alive} workers alive, backlog within limits{held}"


# ---------------------------------------------------------------- status


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    conn = _connect(config, "status")
    try:
        raw = region_status(conn, thresholds(config, STATUS_TIMEOUT))
    finally:
        conn.close()
    verdict = judge(raw["backlog"], raw["fleet"], config.alerts.backlog_rule(), config.alerts.fleet_rule(),
                    raw["partitions_ahead"])
    document = status_document(config, raw, verdict)
    if args.json:
        print(json.dumps(document, sort_keys=True, indent=2))
    else:
        print(render(document))
    return 0


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def status_document(config: Config, raw: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
    """The ``status --json`` document (version 1, docs/operations.md); plain JSON types only."""
    backlog: BacklogFigures = raw["backlog"]
    pending, oldest = raw["pending"], raw["oldest_due"]
    statuses = {window: {s: 0 for s in ("pending", "delivered", "failed", "dead", "shadow")}
                for window in ("last_hour", "last_day")}
    for row in raw["statuses"]:
        for window in statuses:
            statuses[window][row["status"]] = int(row[window])
    processes = [p for p in raw["processes"] if p["alive"]]
    leader = next((p for p in raw["processes"] if p["leader"]), None)
    return {
        "version": JSON_VERSION,
        "region": config.region,
        "generated_at": _iso(pending["db_now"]),
        "health": {"status": verdict.severity.name, "code": int(verdict.severity), "problems": list(verdict.problems)},
        "pending": {
            "total": int(pending["total"]), "scheduled": int(pending["scheduled"]), "due": int(pending["due"]),
            "overdue": {"under_1m": int(pending["overdue_under_1m"]), "1m_5m": int(pending["overdue_1m_5m"]),
                        "5m_15m": int(pending["overdue_5m_15m"]), "over_15m": int(pending["overdue_over_15m"])},
        },
        "backlog": {"overdue_rows": backlog.overdue_rows, "oldest_due_age": _seconds(backlog.oldest_age),
                    "held_rows": backlog.held_rows, "open_breakers": backlog.open_breakers,
                    "limits": {"rows": config.alerts.backlog_rows, "row_age": config.alerts.backlog_row_age,
                               "oldest_age": config.alerts.oldest_pending_age}},
        "oldest_due": None if oldest is None else {
            "id": oldest["id"], "workspace_id": oldest["workspace_id"], "endpoint_id": oldest["endpoint_id"],
            "event_id": oldest["event_id"], "attempt": oldest["attempt"], "created_at": _iso(oldest["created_at"]),
            "due_at": _iso(oldest["next_attempt_at"]), "overdue_seconds": _seconds(oldest["overdue_seconds"]),
            "last_error": oldest["last_error"]},
        "statuses": statuses,
        "breakers": [{"endpoint_id": b["endpoint_id"], "workspace_id": b["workspace_id"], "state": b["state"],
                      "since": _iso(b["since"]), "consecutive_failures": b["consecutive_failures"],
                      "open_until": _iso(b["open_until"]), "pending": int(b["pending"]),
                      "last_error": b["last_error"]} for b in raw["breakers"]],
        "top_failing": [{"endpoint_id": t["endpoint_id"], "workspace_id": t["workspace_id"],
                         "failures": int(t["failures"]), "last_result": t["last_result"],
                         "last_failure_at": _iso(t["last_failure_at"])} for t in raw["top_failing"]],
        "leader": None if leader is None else {"owner": leader["owner"], "host": leader["host"], "pid": leader["pid"],
                                               "last_round_at": _iso(leader["leader_at"])},
        "workers": [{"owner": p["owner"], "host": p["host"], "pid": p["pid"], "started_at": _iso(p["started_at"]),
                     "heartbeat_at": _iso(p["heartbeat_at"]), "heartbeat_age": _seconds(p["heartbeat_age"]),
                     "in_flight": p["in_flight"], "leader": bool(p["leader"])} for p in processes],
        "silent_processes": len(raw["processes"]) - len(processes),
        "last_stop": None if raw["last_stop"] is None else {
            "stopped_at": _iso(raw["last_stop"]["stopped_at"]), "how": raw["last_stop"]["how"],
            "host": raw["last_stop"]["host"], "pid": raw["last_stop"]["pid"]},
        "partitions": {"days_ahead": dict(raw.get("partitions_ahead", {}))},
    }


def _cut(text: Any, width: int) -> str:
    value = "-" if text is None else str(text)
    return value if len(value) <= width else value[: width - 1] + "~"


def _when(iso: str | None) -> str:
    return "-" if iso is None else iso.replace("T", " ")


def render(doc: dict[str, Any]) -> str:
    """The human screen: compact tables, every line at most 100 columns."""
    p, b, health = doc["pending"], doc["backlog"], doc["health"]
    lines = [f"region {doc['region']} at {_when(doc['generated_at'])}   health: {health['status']}"]
    lines += [f"  ! {_cut(problem, WIDTH - 4)}" for problem in health["problems"]]
    o = p["overdue"]
    lines.append(f"pending    total {p['total']}  scheduled {p['scheduled']}  due {p['due']}  overdue: "
                 f"<1m {o['under_1m']}  1-5m {o['1m_5m']}  5-15m {o['5m_15m']}  >15m {o['over_15m']}")
    oldest = "-" if b["oldest_due_age"] is None else f"{b['oldest_due_age']:.0f}s"
    lines.append(f"backlog    overdue>{b['limits']['row_age']:g}s {b['overdue_rows']} (limit {b['limits']['rows']})  "
                 f"oldest due {oldest} (limit {b['limits']['oldest_age']:g}s)  held by breakers {b['held_rows']}")
    if doc["oldest_due"]:
        d = doc["oldest_due"]
        lines.append(_cut(f"oldest     #{d['id']} endpoint {d['endpoint_id']} ({d['workspace_id']}) event "
                          f"{d['event_id']} attempt {d['attempt']}, overdue {d['overdue_seconds']:.0f}s", WIDTH))
    for window, label in (("last_hour", "last hour"), ("last_day", "last day")):
        counts = doc["statuses"][window]
        lines.append(f"{label:<10} " + "  ".join(f"{status} {n}" for status, n in counts.items()))
    lines.append(f"breakers   {len(doc['breakers'])} open or half-open")
    if doc["breakers"]:
        lines.append(f"  {'ENDPOINT':>9} {'WORKSPACE':<20} {'STATE':<9} {'SINCE':<20} {'FAILURES':>8} {'PENDING':>9}")
        lines += [f"  {r['endpoint_id']:>9} {_cut(r['workspace_id'], 20):<20} {r['state']:<9} "
                  f"{_when(r['since']):<20} {r['consecutive_failures']:>8} {r['pending']:>9}" for r in doc["breakers"]]
    lines.append(f"failing    top {len(doc['top_failing'])} endpoints by failed attempts, last hour")
    if doc["top_failing"]:
        lines.append(f"  {'ENDPOINT':>9} {'WORKSPACE':<20} {'FAILURES':>8} {'LAST RESULT':<12} {'LAST FAILURE':<20}")
        lines += [f"  {r['endpoint_id']:>9} {_cut(r['workspace_id'], 20):<20} {r['failures']:>8} "
                  f"{_cut(r['last_result'], 12):<12} {_when(r['last_failure_at']):<20}" for r in doc["top_failing"]]
    leader = doc["leader"]
    lines.append("leader     " + ("none" if leader is None else
                                  _cut(f"{leader['owner']} (last round {_when(leader['last_round_at'])})", WIDTH - 11)))
    silent = f", {doc['silent_processes']} silent" if doc["silent_processes"] else ""
    stop = doc["last_stop"]
    stopped = "" if stop is None else _cut(f"; last stop {_when(stop['stopped_at'])}, {stop['how']}, "
                                           f"{stop['host']} pid {stop['pid']}", WIDTH - 30)
    lines.append(f"workers    {len(doc['workers'])} live{silent}{stopped}")
    if doc["workers"]:
        lines.append(f"  {'HOST':<24} {'PID':>7} {'STARTED':<20} {'BEAT AGO':>8} {'IN FLIGHT':>9} {'':<6}")
        lines += [f"  {_cut(w['host'], 24):<24} {w['pid']:>7} {_when(w['started_at']):<20} "
                  f"{w['heartbeat_age']:>7.1f}s {w['in_flight']:>9} {'leader' if w['leader'] else ''}"
                  for w in doc["workers"]]
    ahead = doc["partitions"]["days_ahead"]
    lines.append("partitions days ahead: " + ("-" if not ahead else
                                              "  ".join(f"{table} {days}" for table, days in sorted(ahead.items()))))
    return "\n".join(line.rstrip() for line in lines)
