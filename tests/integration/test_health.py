"""The health rules (dispatcher/rules/health.py), and the two places that apply them:
the upkeep leader's backlog alert and ``dispatcher check``.  Both read the
same query and judge with the same rule, so the same cases must give the
same answer from each -- including the maintenance-window cases, where rows
wait behind an open or half-open breaker and nothing may fire.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pytest

from dispatcher.cli.status import check_main
from dispatcher.config import config_from_mapping
from dispatcher.engine.upkeep import Upkeep
from dispatcher.metrics import Metrics
from dispatcher.rules.health import BacklogFigures, BacklogRule, FleetFigures, FleetRule, Severity, judge
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher_devtools.kit import query, seed_workspace

RULE = BacklogRule(rows=3, row_age=60.0, oldest_age=600.0)
HEALTHY_FLEET = FleetFigures(heartbeat_age=1.0, workers_alive=2, leader_age=5.0)


# ---------------------------------------------------------------- the pure rules


def figures(overdue: int = 0, oldest: float | None = None, held: int = 0) -> BacklogFigures:
    return BacklogFigures(overdue_rows=overdue, oldest_age=oldest, held_rows=held, open_breakers=1 if held else 0)


@pytest.mark.parametrize(("backlog", "breached"), [
    (figures(), 0),
    (figures(overdue=3, oldest=599.0), 0),          # "more than": the limits themselves are fine
    (figures(overdue=4, oldest=100.0), 1),
    (figures(overdue=0, oldest=600.5), 1),
    (figures(overdue=4, oldest=601.0), 2),
    (figures(overdue=0, oldest=None, held=50_000), 0),   # held rows never alert
])
def test_backlog_rule(backlog: BacklogFigures, breached: int) -> None:
    assert len(RULE.breaches(backlog)) == breached
    verdict = judge(backlog, HEALTHY_FLEET, RULE, FleetRule())
    assert verdict.severity == (Severity.CRITICAL if breached else Severity.OK)


@pytest.mark.parametrize(("fleet", "severity", "words"), [
    # No worker row: never run, or every worker stopped cleanly -- an alert only while rows wait.
    (FleetFigures(None, 0, None), Severity.CRITICAL, "fleet never run: no dispatcher worker has ever recorded a "
                                                     "heartbeat; pending rows wait"),
    (FleetFigures(None, 0, None, rows_waiting=False), Severity.OK, "fleet never run"),
    (FleetFigures(None, 0, None, 73.4, "TERM: graceful shutdown", rows_waiting=True), Severity.CRITICAL,
     "fleet stopped 73s ago (TERM: graceful shutdown); pending rows wait"),
    (FleetFigures(None, 0, None, 73.4, "INT: fast shutdown", rows_waiting=False), Severity.OK,
     "fleet stopped 73s ago (INT: fast shutdown); no pending rows"),
    # Silent rows outrank an older clean stop: something ran after it and died.
    (FleetFigures(61.0, 0, 61.0, 3600.0, "TERM: graceful shutdown"), Severity.CRITICAL, "dead fleet"),
    (FleetFigures(61.0, 0, 61.0), Severity.CRITICAL, "dead fleet"),
    (FleetFigures(59.0, 1, 121.0), Severity.WARNING, "no upkeep leader"),
    (FleetFigures(59.0, 1, None), Severity.WARNING, "no upkeep leader"),
    (FleetFigures(1.0, 3, 119.0), Severity.OK, ""),
])
def test_fleet_rule(fleet: FleetFigures, severity: Severity, words: str) -> None:
    verdict = judge(figures(), fleet, RULE, FleetRule(heartbeat_age=60.0, leader_age=120.0))
    assert verdict.severity == severity
    assert words in " ".join(verdict.problems)


def test_a_backlog_outranks_a_missing_leader() -> None:
    verdict = judge(figures(overdue=10), FleetFigures(1.0, 1, None), RULE, FleetRule())
    assert verdict.severity == Severity.CRITICAL and len(verdict.problems) == 2


def test_config_thresholds_default_to_the_rules_own() -> None:
    alerts = config_from_mapping({}, env={}).alerts
    assert alerts.backlog_rule() == BacklogRule() == BacklogRule(rows=10_000, row_age=300.0, oldest_age=900.0)
    assert alerts.fleet_rule() == FleetRule()


# ---------------------------------------------------------------- the SQL and both judges, on the same cases


@dataclass(frozen=True)
class Rows:
    count: int
    overdue: float          # seconds past next_attempt_at (negative: scheduled in the future)
    breaker: str | None     # endpoint_state.state of their endpoint; None: no breaker row
    status: str = "pending"


CASES = {
    "empty": ([], False, 0),
    "four overdue rows": ([Rows(4, 120, None)], True, 0),
    "three overdue rows (the limit)": ([Rows(3, 120, None)], False, 0),
    "one very old row": ([Rows(1, 700, None)], True, 0),
    "old rows, explicit closed breaker": ([Rows(1, 700, "closed")], True, 0),
    "maintenance window: open breaker": ([Rows(5, 700, "open")], False, 5),
    "a probe: half-open breaker": ([Rows(5, 700, "half_open")], False, 5),
    "held rows do not add up with live ones": ([Rows(2, 120, None), Rows(5, 120, "open")], False, 5),
    "not due yet": ([Rows(10, -700, None)], False, 0),
    "finished rows are not backlog": ([Rows(10, 700, None, "dead"), Rows(10, 700, None, "delivered")], False, 0),
}


def _seed(dsn: str, groups: list[Rows]) -> None:
    endpoints = seed_workspace(dsn, "ws", [f"http://127.0.0.1:9/{n}" for n in range(len(groups))])
    for endpoint, group in zip(endpoints, groups, strict=True):
        if group.breaker:
            query(dsn, "INSERT INTO endpoint_state (endpoint_id, state, open_until, opened_at) "
                       "VALUES (%s, %s, now() + interval '5 minutes', now())", (endpoint, group.breaker))
        for n in range(group.count):
            query(dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, "
                       "next_attempt_at) VALUES ('ws', %s, %s, 'h', %s, now() - make_interval(secs => %s))",
                  (endpoint, f"ev-{endpoint}-{n}", group.status, group.overdue))
    # A healthy fleet, so that the check's verdict is the backlog's alone.
    query(dsn, "INSERT INTO dispatcher_processes (owner, region, host, pid, started_at, leader_at) "
               "VALUES ('h:1:w1', 'test', 'h', 1, now(), now())")


@pytest.mark.parametrize("case", list(CASES))
def test_upkeep_alert_and_check_agree(case: str, db, write_config, capsys, caplog) -> None:
    groups, fires, held = CASES[case]
    _seed(db.dsn, groups)
    alerts = {"backlog_rows": RULE.rows, "backlog_row_age": "60s", "oldest_pending_age": "10m"}
    path = write_config(db, alerts=alerts)
    config = config_from_mapping({"region": "test", "database": {"dsn": db.dsn}, "statsd": {"enabled": False},
                                  "alerts": alerts}, env={})

    store = EngineStore(ManagedConnection(db.dsn, "test"))
    assert store.backlog(RULE).held_rows == held
    with caplog.at_level(logging.WARNING, logger="dispatcher.upkeep"):
        Upkeep(config, store, Metrics(config.statsd)).run_once()
    upkeep_fired = any("backlog alert:" in r.getMessage() for r in caplog.records)

    code = check_main(str(path), as_json=True)
    document = json.loads(capsys.readouterr().out)
    assert (upkeep_fired, code == Severity.CRITICAL) == (fires, fires), document
    assert code == (Severity.CRITICAL if fires else Severity.OK), document
    assert document["backlog"]["held_rows"] == held
