"""Rollout controls (issue 10): the rule, its SQL twin, the CLI, the replay guard and the gate reports.

The CLI runs as a user runs it (a subprocess); gate data is seeded with SQL,
as the engine would have written it.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import falcon.testing
import pytest
from psycopg2.extensions import make_dsn

from dispatcher import Event, WebhookSender, load_config
from dispatcher.api import auth
from dispatcher.api.app import create_app
from dispatcher.cli.rollout import rank_lines
from dispatcher.rules.rollout import Listed, bucket, outbox_on
from dispatcher.runtime.exitcodes import ExitCode
from dispatcher.store import rollout as rollout_store
from tests.conftest import TestDatabase as Database
from tests.e2e.test_cli import UNREACHABLE_DSN, assert_one_line_error, cli

WriteConfig = Callable[..., Path]
SECRET = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ="


def sql(db: Database, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    return db.query(statement, params)


def workspace(db: Database, ws: str, flag: bool | None = None) -> str:
    flags = {} if flag is None else {"webhook_outbox": flag}
    sql(db, "INSERT INTO workspaces (id, secret, flags) VALUES (%s, %s, %s)", (ws, SECRET, json.dumps(flags)))
    return ws


# ---------------------------------------------------------------- the rule, once
#
# The rule has one home (``dispatcher.rules.rollout``); everything that decides
# or counts with it is held to the same table of cases: the pure rule, its SQL
# twin (``webhook_outbox_on``, migration 0004), the producer's one statement
# (``dispatcher_send_event``, 0012) and the ``rollout status`` count.


@dataclass(frozen=True)
class Case:
    name: str
    flag: bool | None     # the workspace's webhook_outbox flag; None: not set
    listed: Listed        # rollout_workspaces' list
    percent: int          # rollout_settings.percent
    bucket: int           # the workspace's rollout_bucket
    on: bool              # its events go to the outbox


CASES = [
    Case("the flag on overrides everything", True, "exclude", 0, 99, True),
    Case("the flag off overrides everything", False, "include", 100, 0, False),
    Case("then exclude", None, "exclude", 100, 0, False),
    Case("then include", None, "include", 0, 99, True),
    Case("then the percentage: under it", None, None, 50, 49, True),
    Case("then the percentage: at it", None, None, 50, 50, False),
    Case("0 % takes nobody", None, None, 0, 0, False),
    Case("100 % takes everybody", None, None, 100, 99, True),
]
IDS = [case.name for case in CASES]


def _in_bucket(wanted: int) -> str:
    """A workspace id whose bucket is ``wanted`` (the SQL's is checked to agree where it matters)."""
    return next(ws for ws in (f"ws-{n}" for n in itertools.count()) if bucket(ws) == wanted)


def _seed_case(db: Database, case: Case) -> str:
    ws = workspace(db, _in_bucket(case.bucket), case.flag)
    assert sql(db, "SELECT rollout_bucket(%s)", (ws,)) == [(case.bucket,)]
    if case.listed is not None:
        sql(db, "INSERT INTO rollout_workspaces (workspace_id, list) VALUES (%s, %s)", (ws, case.listed))
    sql(db, "UPDATE rollout_settings SET percent = %s", (case.percent,))
    return ws


class TestRule:
    @pytest.mark.parametrize("case", CASES, ids=IDS)
    def test_the_rule(self, case: Case) -> None:
        assert outbox_on(case.flag, case.listed, case.percent, case.bucket) is case.on

    @pytest.mark.parametrize("case", CASES, ids=IDS)
    def test_the_sql_function_agrees(self, db: Database, case: Case) -> None:
        flag = None if case.flag is None else json.dumps(case.flag)
        assert sql(db, "SELECT webhook_outbox_on(%s::jsonb, %s, %s, %s)",
                   (flag, case.listed, case.percent, case.bucket)) == [(case.on,)]

    @pytest.mark.parametrize("case", CASES, ids=IDS)
    def test_send_and_status_agree(self, db: Database, write_config: WriteConfig, case: Case) -> None:
        ws = _seed_case(db, case)
        sender = WebhookSender(load_config(write_config(db), env={}))
        conn = db.connect()
        try:
            stored = sender.send(conn, Event(ws, "job.created", {}))
            conn.commit()
            counts = rollout_store.status(conn)["counts"]
        finally:
            conn.close()
        assert stored.mode == ("live" if case.on else None)
        assert (counts["workspaces"], counts["outbox_on"]) == (1, int(case.on))

    def test_sql_agrees_with_python_on_every_case(self, db: Database) -> None:
        cases = list(itertools.product([True, False, None], ["include", "exclude", None],
                                       [(0, 0), (1, 0), (50, 49), (50, 50), (100, 99), (99, 99)]))
        flags = {True: "true", False: "false", None: None}
        for flag, listed, (percent, bucket_) in cases:
            (got,), = sql(db, "SELECT webhook_outbox_on(%s::jsonb, %s, %s, %s)",
                          (flags[flag], listed, percent, bucket_))
            assert got is outbox_on(flag, listed, percent, bucket_), (flag, listed, percent, bucket_)
        # A flag that is not a JSON boolean is no override.
        assert sql(db, "SELECT webhook_outbox_on('\"on\"'::jsonb, NULL, 0, 0)") == [(False,)]

    def test_bucket_is_computed_identically(self, db: Database) -> None:
        ids = [f"ws-{n}" for n in range(300)] + ["ünï", "a b", ""]
        got = dict(sql(db, "SELECT id, rollout_bucket(id) FROM unnest(%s::text[]) id", (ids,)))
        assert got == {ws: bucket(ws) for ws in ids}
        assert len(set(got.values())) > 50  # spread over the buckets

    def test_the_set_at_25_is_inside_the_set_at_50(self) -> None:
        ids = [f"ws-{n}" for n in range(1000)]
        at = {p: {ws for ws in ids if outbox_on(None, None, p, bucket(ws))} for p in (25, 50)}
        assert at[25] < at[50] and 150 < len(at[25]) < 350


class TestSendFollowsTheRule:
    """The decision is made inside send()'s one statement."""

    def mode(self, db: Database, sender: WebhookSender, ws: str) -> str | None:
        conn = db.connect()
        try:
            stored = sender.send(conn, Event(ws, "job.created", {}))
            conn.commit()
            return stored.mode
        finally:
            conn.close()

    def test_percent_lists_and_flag(self, db: Database, write_config: WriteConfig) -> None:
        sender = WebhookSender(load_config(write_config(db), env={}))
        for ws, flag in (("plain", None), ("listed", None), ("forced_off", False), ("forced_on", True)):
            workspace(db, ws, flag)
        assert [self.mode(db, sender, ws) for ws in ("plain", "forced_on", "forced_off")] == [None, "live", None]
        sql(db, "INSERT INTO rollout_workspaces (workspace_id, list) VALUES ('listed', 'include'), "
                "('forced_off', 'include')")
        assert [self.mode(db, sender, ws) for ws in ("listed", "forced_off")] == ["live", None]
        sql(db, "UPDATE rollout_settings SET percent = 100")
        sql(db, "UPDATE rollout_workspaces SET list = 'exclude' WHERE workspace_id = 'listed'")
        assert [self.mode(db, sender, ws) for ws in ("plain", "listed")] == ["live", None]


# ---------------------------------------------------------------- the CLI


class TestRolloutCommands:
    @pytest.fixture
    def config(self, db: Database, write_config: WriteConfig) -> Path:
        workspace(db, "alpha")
        workspace(db, "beta", flag=False)
        return write_config(db)

    def test_set_include_exclude_and_status(self, db: Database, config: Path) -> None:
        assert cli("-c", config, "rollout", "set", "--percent", "40").returncode == 0
        assert cli("-c", config, "rollout", "include", "alpha").returncode == 0
        assert cli("-c", config, "rollout", "exclude", "beta").returncode == 0
        status = cli("-c", config, "rollout", "status", "--json")
        assert status.returncode == 0, status.stderr
        body = json.loads(status.stdout)
        assert body["percent"] == 40
        assert body["listed"] == [{"workspace_id": "beta", "list": "exclude"},
                                  {"workspace_id": "alpha", "list": "include"}]
        assert body["counts"] | {} == {"workspaces": 2, "outbox_on": 1, "flag_on": 0, "flag_off": 1,
                                       "included": 1, "excluded": 1}
        text = cli("-c", config, "rollout", "status").stdout
        assert "percent: 40" in text and "include: alpha" in text and "exclude: beta" in text
        assert cli("-c", config, "rollout", "unlist", "alpha", "beta").returncode == 0
        assert sql(db, "SELECT count(*) FROM rollout_workspaces") == [(0,)]

    @pytest.mark.parametrize("percent", ["150", "-1", "ten"])
    def test_bad_percent_is_one_line(self, db: Database, config: Path, percent: str) -> None:
        assert_one_line_error(cli("-c", config, "rollout", "set", "--percent", percent), ExitCode.USAGE,
                              "--percent", percent)
        assert sql(db, "SELECT percent FROM rollout_settings") == [(0,)]

    def test_listing_an_unknown_workspace_changes_nothing(self, db: Database, config: Path) -> None:
        assert_one_line_error(cli("-c", config, "rollout", "include", "alpha", "ghost"), ExitCode.FAILURE,
                              "ghost")
        assert sql(db, "SELECT count(*) FROM rollout_workspaces") == [(0,)]

    @pytest.mark.parametrize("prefix", [["workspace"], ["rollout", "workspace"]])
    def test_workspace_flag(self, db: Database, config: Path, prefix: list[str]) -> None:
        assert cli("-c", config, *prefix, "flag", "--id", "alpha", "webhook_outbox=on").returncode == 0
        assert sql(db, "SELECT flags FROM workspaces WHERE id = 'alpha'") == [({"webhook_outbox": True},)]
        assert cli("-c", config, *prefix, "flag", "--id", "alpha", "webhook_outbox=default").returncode == 0
        assert sql(db, "SELECT flags FROM workspaces WHERE id = 'alpha'") == [({},)]
        assert_one_line_error(cli("-c", config, *prefix, "flag", "--id", "ghost", "webhook_outbox=on"),
                              ExitCode.FAILURE, "ghost")
        assert sql(db, "SELECT count(*) FROM workspaces WHERE id = 'ghost'") == [(0,)], "never created"
        assert_one_line_error(cli("-c", config, *prefix, "flag", "--id", "alpha", "webhook_outbox=maybe"),
                              ExitCode.USAGE, "webhook_outbox=maybe")

    @pytest.mark.usefixtures("config")
    def test_a_refused_write_is_one_line(self, db: Database, write_config: WriteConfig) -> None:
        read_only = make_dsn(db.dsn, options="-c default_transaction_read_only=on")
        config = write_config(db, database={"dsn": read_only})
        for args in (["rollout", "set", "--percent", "5"], ["rollout", "include", "alpha"],
                     ["workspace", "flag", "--id", "alpha", "webhook_outbox=default"]):
            assert_one_line_error(cli("-c", config, *args), ExitCode.DATABASE_UNAVAILABLE, "read-only")
        assert sql(db, "SELECT percent FROM rollout_settings") == [(0,)]

    def test_a_statement_past_its_timeout_is_one_line(self, db: Database, write_config: WriteConfig) -> None:
        config = write_config(db, database={"dsn": make_dsn(db.dsn, options="-c statement_timeout=300")})
        blocker = db.connect()
        try:
            with blocker.cursor() as cur:
                cur.execute("LOCK TABLE webhook_deliveries, rollout_settings IN ACCESS EXCLUSIVE MODE")
            for args in (["rollout", "status"], ["gate", "phase3"]):
                assert_one_line_error(cli("-c", config, *args), ExitCode.DATABASE_UNAVAILABLE, "too long")
        finally:
            blocker.rollback()
            blocker.close()

    def test_unreachable_database_is_one_line(self, db: Database, write_config: WriteConfig) -> None:
        config = write_config(db, database={"dsn": UNREACHABLE_DSN})
        for args in (["rollout", "status"], ["rollout", "set", "--percent", "5"], ["gate", "phase3"]):
            assert_one_line_error(cli("-c", config, *args), ExitCode.DATABASE_UNAVAILABLE, "database")


class TestRank:
    LINES = [
        "2026-12-02 INFO dispatcher.producer legacy webhook workspace_id=a endpoint_id=1 event_id=e1 status=200 "
        "duration_ms=5",
        "2026-12-02 INFO dispatcher.producer legacy webhook workspace_id=a endpoint_id=1 event_id=e2 status=503 "
        "duration_ms=5",
        '{"message": "legacy webhook workspace_id=b endpoint_id=2 event_id=e3 status=timeout duration_ms=5000"}',
        "2026-12-02 INFO dispatcher.producer legacy webhook workspace_id=a endpoint_id=3 event_id=e4 status=204 "
        "duration_ms=5",
        "2026-12-02 INFO dispatcher.engine.worker attempt event_id=e5 endpoint_id=9 status=dead duration_ms=5",
    ]

    def test_worst_first(self) -> None:
        ranked = [(r.workspace_id, r.endpoint_id, r.posts, r.failures) for r in rank_lines(self.LINES)]
        assert ranked == [("b", "2", 1, 1), ("a", "1", 2, 1), ("a", "3", 1, 0)]

    def test_command(self, db: Database, write_config: WriteConfig, tmp_path: Path) -> None:
        log = tmp_path / "producer.log"
        log.write_text("\n".join(self.LINES) + "\n")
        result = cli("-c", write_config(db), "rollout", "rank", "--log", log, "--top", "2", "--json")
        assert result.returncode == 0, result.stderr
        assert [(r["workspace_id"], r["endpoint_id"]) for r in json.loads(result.stdout)] == [("b", "2"), ("a", "1")]
        assert_one_line_error(cli("-c", write_config(db), "rollout", "rank", "--log", tmp_path / "nope.log"),
                              ExitCode.USAGE, "nope.log")


# ---------------------------------------------------------------- replay of a shadow row


def test_replaying_a_shadow_row_while_the_outbox_is_off_is_409(db: Database, write_config: WriteConfig) -> None:
    workspace(db, "ws", flag=False)
    (endpoint,), = sql(db, "INSERT INTO webhook_endpoints (workspace_id, url) VALUES ('ws', 'https://h.example/') "
                           "RETURNING id")
    sql(db, "INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES ('e1', 'ws', 't', 1, '{}')")
    (shadow,), = sql(db, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, "
                         "mode, event_day) SELECT 'ws', %s, id, 'h', 'shadow', 'shadow', day FROM events "
                         "WHERE workspace_id = 'ws' AND id = 'e1' RETURNING id", (endpoint,))
    conn = db.connect()
    token = auth.create_token(conn, "ws", [auth.READ, auth.WRITE])
    conn.close()
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    try:
        client = falcon.testing.TestClient(app)
        replay = f"/v2/webhooks/deliveries/{shadow}/replay"
        refused = client.simulate_post(replay, headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 409 and refused.headers["content-type"] == "application/problem+json"
        assert "shadow" in refused.json["detail"]
        assert sql(db, "SELECT count(*) FROM webhook_deliveries WHERE mode = 'live'") == [(0,)]
        sql(db, "UPDATE workspaces SET flags = '{\"webhook_outbox\": true}'")
        accepted = client.simulate_post(replay, headers={"Authorization": f"Bearer {token}"})
        assert accepted.status_code == 202, accepted.text
    finally:
        app.pool.close()


# ---------------------------------------------------------------- gate reports


class Seed:
    def __init__(self, db: Database) -> None:
        self.db = db
        workspace(db, "ws", flag=True)
        (self.endpoint,), = sql(db, "INSERT INTO webhook_endpoints (workspace_id, url) VALUES ('ws', "
                                    "'https://h.example/') RETURNING id")
        self.n = 0

    def row(self, mode: str = "live", status: str | None = None, attempt: int = 1, age_s: float = 60,
            finished_after_s: float | None = 0.5, first_attempt_after_s: float | None = 0.5,
            type_: str = "job.created", event_id: str | None = None, replay_of: int | None = None) -> int:
        self.n += 1
        event_id = event_id or f"e{self.n}"
        status = status or ("shadow" if mode == "shadow" else "delivered")  # a marked shadow row is 'shadow'
        sql(self.db, "INSERT INTO events (id, workspace_id, type, sequence, payload, created_at) "
                     "VALUES (%s, 'ws', %s, %s, '{}', now() - %s) ON CONFLICT (workspace_id, id, day) DO NOTHING",
            (event_id, type_, self.n, timedelta(seconds=age_s)))
        (delivery,), = sql(self.db, """
            INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, mode, attempt,
                                            created_at, finished_at, replay_of, event_day)
            SELECT 'ws', %(ep)s, %(ev)s, 'h', %(status)s, %(mode)s, %(attempt)s, now() - %(age)s,
                   CASE WHEN %(fin)s::float8 IS NULL THEN NULL
                        ELSE now() - %(age)s + make_interval(secs => %(fin)s) END, %(replay_of)s, e.day
              FROM events e WHERE e.workspace_id = 'ws' AND e.id = %(ev)s
            RETURNING id""", {"ep": self.endpoint, "ev": event_id, "status": status, "mode": mode,
                              "attempt": attempt, "age": timedelta(seconds=age_s), "fin": finished_after_s,
                              "replay_of": replay_of})
        if first_attempt_after_s is not None and attempt >= 1:
            sql(self.db, "INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, "
                         "duration_ms, result, status_code) VALUES (%s, %s, 1, now() - %s + make_interval(secs => %s),"
                         " 10, %s, %s)",
                (delivery, self.endpoint, timedelta(seconds=age_s), first_attempt_after_s,
                 *{"delivered": ("delivered", 200), "shadow": ("shadow", None)}.get(status, ("http_5xx", 500))))
        return delivery


    def bulk(self, rows: int, first_attempt_after_s: float = 0.5) -> None:
        """``rows`` delivered live rows in one statement, each attempted once after the given delay."""
        sql(self.db, """
            WITH ev AS (
                INSERT INTO events (id, workspace_id, type, sequence, payload, created_at)
                SELECT 'bulk-' || g, 'ws', 'job.created', 1000000 + g, '{}', now() - interval '1 minute'
                  FROM generate_series(1, %(rows)s) g RETURNING id, day
            ), d AS (
                INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, attempt,
                                                created_at, finished_at, event_day)
                SELECT 'ws', %(ep)s, id, 'h', 'delivered', 1, now() - interval '1 minute',
                       now() - interval '1 minute' + make_interval(secs => %(after)s), day FROM ev
                RETURNING id, created_at
            )
            INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, duration_ms,
                                                   result, status_code)
            SELECT id, %(ep)s, 1, created_at + make_interval(secs => %(after)s), 10, 'delivered', 200 FROM d
            """, {"rows": rows, "ep": self.endpoint, "after": first_attempt_after_s})

    def shadow_hourly(self, hours: int, wait_s: float = 0.8) -> None:
        """A shadow row marked after ``wait_s`` 30 s before each of the last ``hours`` + 1 whole hours."""
        sql(self.db, """
            WITH ev AS (
                INSERT INTO events (id, workspace_id, type, sequence, payload, created_at)
                SELECT 'shadow-' || g, 'ws', 'job.created', 2000000 + g, '{}',
                       now() - make_interval(secs => g * 3600 + 30)
                  FROM generate_series(0, %(hours)s) g RETURNING id, created_at, day
            )
            INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, mode, attempt,
                                            created_at, finished_at, event_day)
            SELECT 'ws', %(ep)s, id, 'h', 'shadow', 'shadow', 1, created_at,
                   created_at + make_interval(secs => %(wait)s), day FROM ev
            """, {"hours": hours, "ep": self.endpoint, "wait": wait_s})


@pytest.fixture
def seed(db: Database) -> Seed:
    return Seed(db)


def samples(db: Database, hours: float, step_s: float = 10.0, age: float | None = 0.5,
            skip: tuple[float, float] | None = None) -> None:
    """The upkeep leader's backlog samples, one every ``step_s`` from ``hours`` ago to now, none
    between ``skip`` = (from, to) hours ago."""
    low, high = (skip[0] * 3600, skip[1] * 3600) if skip else (-1.0, -1.0)
    sql(db, """
        INSERT INTO backlog_samples (taken_at, oldest_age, overdue_rows, held_rows, alerting)
        SELECT now() - make_interval(secs => g * %(step)s), %(age)s, 0, 0, false
          FROM generate_series(0, ceil(%(hours)s * 3600 / %(step)s)::int) g
         WHERE NOT (g * %(step)s > %(low)s AND g * %(step)s < %(high)s)
        """, {"hours": hours, "step": step_s, "age": age, "low": low, "high": high})


def alerts(db: Database, *days_ago: float) -> None:
    for days in days_ago:
        sql(db, "INSERT INTO alert_episodes (alert, fired_at, cleared_at, detail) VALUES ('backlog', "
                "now() - make_interval(secs => %(s)s), now() - make_interval(secs => %(s)s - 600), 'seeded')",
            {"s": days * 86400})


BUCKET = "webhook_producer_outbox_write_seconds_bucket"


def prometheus_export(path: Path, hours: float = 72.2, under_2ms: float = 0.995, kind: str = "matrix") -> Path:
    """A /api/v1/query_range answer: the cumulative buckets every 5 minutes up to now, 1,000
    observations a step, ``under_2ms`` of them at most 2 ms."""
    now = time.time()
    steps = int(hours * 12)
    times = [now - (steps - n) * 300 for n in range(steps + 1)]
    shares = {"0.001": 0.5, "0.002": under_2ms, "0.005": 1.0, "+Inf": 1.0}
    result = [{"metric": {"__name__": BUCKET, "le": le, "region": "test"},
               "values": [[t, str(n * 1000 * share)] for n, t in enumerate(times)]} for le, share in shares.items()]
    if kind == "vector":
        result = [{"metric": r["metric"], "value": r["values"][-1]} for r in result]
    path.write_text(json.dumps({"status": "success", "data": {"resultType": kind, "result": result}}))
    return path


def exporter_dump(path: Path, started_hours_ago: float, under_2ms: float = 0.995) -> Path:
    """statsd_exporter's /metrics as curl saves it: counts since the exporter started."""
    total = 100_000
    lines = ["# HELP webhook_producer_outbox_write_seconds outbox write",
             "# TYPE webhook_producer_outbox_write_seconds histogram"]
    for le, share in (("0.001", 0.5), ("0.002", under_2ms), ("0.005", 1.0), ("+Inf", 1.0)):
        lines.append(f'{BUCKET}{{region="test",le="{le}"}} {int(total * share)}')
    lines += [f'webhook_producer_outbox_write_seconds_sum{{region="test"}} {total * 0.001}',
              f'webhook_producer_outbox_write_seconds_count{{region="test"}} {total}',
              "# TYPE process_start_time_seconds gauge",
              f"process_start_time_seconds {time.time() - started_hours_ago * 3600:.2f}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def gate(config: Path, *args: str | Path) -> tuple[int, dict[str, Any]]:
    """The gate's JSON report; its window ends now, as the test runs it, not when the subprocess gets going."""
    until = () if "--until" in args else ("--until", datetime.now(UTC).isoformat())
    result = cli("-c", config, "gate", *args, *until, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def results(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["result"] for c in report["criteria"]}


class TestPhase0Gate:
    def evidence(self, db: Database, seed: Seed) -> None:
        samples(db, 72.1)
        seed.shadow_hourly(72)

    def test_72_hours_of_evidence_pass(self, db: Database, write_config: WriteConfig, seed: Seed,
                                       tmp_path: Path) -> None:
        self.evidence(db, seed)
        code, report = gate(write_config(db), "phase0", "--producer-timings", prometheus_export(tmp_path / "p.json"))
        assert (code, report["verdict"], report["missing"]) == (0, "pass", [])
        found = {c["name"]: c["value"] for c in report["criteria"]}
        assert found["dry_run_backlog_max"] == pytest.approx(0.8)
        assert 0.001 < found["producer_p99"] < 0.002
        assert report["details"]["shadow_rows"] == 72

    def test_a_statsd_exporter_dump_is_read_too(self, db: Database, write_config: WriteConfig, seed: Seed,
                                                tmp_path: Path) -> None:
        self.evidence(db, seed)
        config = write_config(db)
        code, report = gate(config, "phase0", "--producer-timings", exporter_dump(tmp_path / "m.txt", 80))
        assert (code, report["verdict"]) == (0, "pass"), report["missing"]
        code, report = gate(config, "phase0", "--producer-timings",
                            exporter_dump(tmp_path / "slow.txt", 80, under_2ms=0.98))
        assert (code, results(report)["producer_p99"]) == (ExitCode.FAILURE, "fail")
        code, report = gate(config, "phase0", "--producer-timings", exporter_dump(tmp_path / "young.txt", 10))
        assert (code, results(report)["producer_p99"]) == (ExitCode.INCOMPLETE, "incomplete")
        assert "after the window's start" in report["missing"][0]

    def test_one_shadow_row_a_minute_old_is_incomplete(self, db: Database, write_config: WriteConfig, seed: Seed,
                                                        tmp_path: Path) -> None:
        seed.row(mode="shadow", finished_after_s=0.5)
        code, report = gate(write_config(db), "phase0", "--producer-timings", prometheus_export(tmp_path / "p.json"))
        assert (code, report["verdict"], report["passed"]) == (ExitCode.INCOMPLETE, "incomplete", False)
        assert results(report) == {"window": "pass", "producer_p99": "pass", "dry_run_backlog_max": "incomplete"}
        assert any(line.startswith("backlog samples: nothing from") for line in report["missing"])
        assert any(line.startswith("shadow rows: none written from") for line in report["missing"])

    def test_without_producer_timings_it_is_incomplete(self, db: Database, write_config: WriteConfig,
                                                        seed: Seed) -> None:
        self.evidence(db, seed)
        result = cli("-c", write_config(db), "gate", "phase0")
        assert result.returncode == ExitCode.INCOMPLETE, result.stderr
        assert "gate phase0: INCOMPLETE" in result.stdout
        assert "missing: producer timings: no --producer-timings FILE given" in result.stdout

    @pytest.mark.parametrize(("content", "words"), [
        (None, "cannot read it"),
        ("{not json", "not JSON"),
        ('{"status": "error", "error": "query timed out"}', "query timed out"),
        ('{"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}', "a scalar result"),
        ("webhook_producer_outbox_write_seconds{quantile=\"0.99\"} 0.001\n", "is a summary here"),
    ])
    def test_an_unusable_export_is_incomplete_and_named(self, db: Database, write_config: WriteConfig, seed: Seed,
                                                        tmp_path: Path, content: str | None, words: str) -> None:
        self.evidence(db, seed)
        path = tmp_path / "export"
        if content is not None:
            path.write_text(content)
        code, report = gate(write_config(db), "phase0", "--producer-timings", path)
        assert code == ExitCode.INCOMPLETE
        assert report["missing"][0].startswith(f"producer timings: {path}: ") and words in report["missing"][0]

    def test_an_instant_vector_cannot_show_72_hours(self, db: Database, write_config: WriteConfig, seed: Seed,
                                                    tmp_path: Path) -> None:
        self.evidence(db, seed)
        code, report = gate(write_config(db), "phase0", "--producer-timings",
                            prometheus_export(tmp_path / "v.json", kind="vector"))
        assert (code, results(report)["producer_p99"]) == (ExitCode.INCOMPLETE, "incomplete")

    def test_an_unmarked_shadow_row_fails(self, db: Database, write_config: WriteConfig, seed: Seed,
                                          tmp_path: Path) -> None:
        self.evidence(db, seed)
        seed.row(mode="shadow", status="pending", finished_after_s=None, age_s=30)   # 30 s and counting
        code, report = gate(write_config(db), "phase0", "--producer-timings", prometheus_export(tmp_path / "p.json"))
        assert (code, results(report)["dry_run_backlog_max"]) == (ExitCode.FAILURE, "fail")
        assert report["details"]["shadow_unmarked"] == 1

    def test_a_sampled_backlog_peak_fails_and_a_sampling_gap_is_incomplete(
            self, db: Database, write_config: WriteConfig, seed: Seed, tmp_path: Path) -> None:
        samples(db, 72.1, skip=(30, 31))
        seed.shadow_hourly(72)
        config = write_config(db)
        timings = prometheus_export(tmp_path / "p.json")
        code, report = gate(config, "phase0", "--producer-timings", timings)
        assert (code, results(report)["dry_run_backlog_max"]) == (ExitCode.INCOMPLETE, "incomplete")
        assert len(report["missing"]) == 1 and report["missing"][0].startswith("backlog samples: nothing from")
        sql(db, "INSERT INTO backlog_samples (taken_at, oldest_age, overdue_rows, held_rows, alerting) "
                "VALUES (now() - interval '2 hours', 5.0, 0, 0, false)")
        code, report = gate(config, "phase0", "--producer-timings", timings)
        assert (code, results(report)["dry_run_backlog_max"]) == (ExitCode.FAILURE, "fail")

    def test_a_window_shorter_than_72_hours_is_incomplete(self, db: Database, write_config: WriteConfig,
                                                          seed: Seed, tmp_path: Path) -> None:
        self.evidence(db, seed)
        code, report = gate(write_config(db), "phase0", "--since", "71h",
                            "--producer-timings", prometheus_export(tmp_path / "p.json"))
        assert (code, results(report)["window"]) == (ExitCode.INCOMPLETE, "incomplete")
        assert report["missing"][0].startswith("window: 2 d 23 h")

    def test_options_of_other_phases_are_refused(self, db: Database, write_config: WriteConfig,
                                                 tmp_path: Path) -> None:
        config = write_config(db)
        assert_one_line_error(cli("-c", config, "gate", "phase0", "--received", tmp_path / "ids.txt"),
                              ExitCode.USAGE, "--received", "phase1")
        assert_one_line_error(cli("-c", config, "gate", "phase3", "--workspace", "ws"),
                              ExitCode.USAGE, "--workspace", "phase1 and phase2")
        assert_one_line_error(cli("-c", config, "gate", "phase0", "--since", "2026-09-22T12:00",
                                  "--until", "2026-09-22T12:00"),
                              ExitCode.USAGE, "window is empty")


class TestPhase1Gate:
    def test_every_event_received(self, db: Database, write_config: WriteConfig, seed: Seed,
                                  tmp_path: Path) -> None:
        config = write_config(db)
        for _ in range(3):
            seed.row()
        received = tmp_path / "received.txt"
        received.write_text("e1\ne2\ne3\nsomething-else\n")
        code, report = gate(config, "phase1", "--workspace", "ws", "--received", received)
        assert (code, report["verdict"], report["details"]["events_checked"]) == (0, "pass", 3)
        received.write_text("e1\n")
        code, report = gate(config, "phase1", "--workspace", "ws", "--received", received)
        assert (code, report["criteria"][1]["value"]) == (ExitCode.FAILURE, 2)
        assert [m["event_id"] for m in report["details"]["missing_events"]] == ["e2", "e3"]
        text = cli("-c", config, "gate", "phase1", "--workspace", "ws", "--received", received).stdout
        assert "lost: e2" in text and "lost: e3 workspace=ws type=job.created" in text and "FAIL" in text

    def test_missing_or_unreadable_receiver_list_is_incomplete(self, db: Database, write_config: WriteConfig,
                                                               seed: Seed, tmp_path: Path) -> None:
        config = write_config(db)
        seed.row()
        code, report = gate(config, "phase1", "--workspace", "ws")
        assert code == ExitCode.INCOMPLETE and report["missing"] == [
            "received ids: no --received FILE given (the test receiver's event ids, one per line)"]
        code, report = gate(config, "phase1", "--workspace", "ws", "--received", tmp_path / "absent.txt")
        assert code == ExitCode.INCOMPLETE and "absent.txt" in report["missing"][0]

    def test_a_week_not_all_on_the_outbox_is_incomplete(self, db: Database, write_config: WriteConfig, seed: Seed,
                                                        tmp_path: Path) -> None:
        config = write_config(db)
        seed.row()
        seed.row(mode="shadow", age_s=3 * 86400)   # the flag was off three days ago: a synchronous send
        received = tmp_path / "received.txt"
        received.write_text("e1\n")
        code, report = gate(config, "phase1", "--workspace", "ws", "--received", received)
        assert code == ExitCode.INCOMPLETE
        assert report["missing"][0].startswith("workspace ws: 1 event(s) of the window went the synchronous path")
        code, report = gate(config, "phase1", "--workspace", "ws", "--received", received, "--since", "2d")
        assert code == ExitCode.INCOMPLETE and report["missing"][0].startswith("window: 2 d from")

    def test_an_unknown_workspace_is_bad_input(self, db: Database, write_config: WriteConfig,
                                               tmp_path: Path) -> None:
        config = write_config(db)
        assert_one_line_error(cli("-c", config, "gate", "phase1", "--workspace", "nope", "--received",
                                  tmp_path / "ids.txt"), ExitCode.USAGE, "nope")
        assert_one_line_error(cli("-c", config, "gate", "phase1"), ExitCode.USAGE, "--workspace")


class TestPhase2Gate:
    def test_rate_for_the_beta_workspaces(self, db: Database, write_config: WriteConfig, seed: Seed) -> None:
        config = write_config(db, retry={"policies": {"technician.location": {"max_attempts": 1}}})
        seed.bulk(2000)
        seed.row(status="dead", attempt=1, type_="technician.location")  # one attempt is its policy
        retried = seed.row(status="dead", attempt=1)
        seed.row(status="delivered", event_id=f"e{seed.n}", replay_of=retried)  # later replayed successfully
        code, report = gate(config, "phase2")
        assert (code, report["missing"]) == (ExitCode.INCOMPLETE, [
            "beta workspaces: none (the include list is empty and no --workspace was given)",
            f"deliveries: 0 in the window; fewer than 2000 cannot show a rate under {0.0005:.2%}"])
        sql(db, "INSERT INTO rollout_workspaces (workspace_id, list) VALUES ('ws', 'include')")
        code, report = gate(config, "phase2")
        assert (code, report["verdict"]) == (0, "pass"), report
        assert report["details"]["never_retried"] == 0 and report["details"]["workspaces"] == ["ws"]
        seed.row(status="failed", attempt=1)
        seed.row(status="dead", attempt=0)
        code, report = gate(config, "phase2", "--workspace", "ws")
        assert (code, report["verdict"], report["details"]["never_retried"]) == (ExitCode.FAILURE, "fail", 2)

    def test_too_few_deliveries_are_incomplete(self, db: Database, write_config: WriteConfig, seed: Seed) -> None:
        for _ in range(5):
            seed.row()
        code, report = gate(write_config(db), "phase2", "--workspace", "ws")
        assert code == ExitCode.INCOMPLETE and report["missing"][0].startswith("deliveries: 5 in the window")

    def test_duplicate_sends_are_reported(self, db: Database, write_config: WriteConfig, seed: Seed) -> None:
        first = seed.row()
        seed.row(event_id="e1", replay_of=first)  # a second 2xx for the same event and endpoint
        code, report = gate(write_config(db), "phase2", "--workspace", "ws")
        assert report["details"]["duplicate_sends"] == 1


class TestPhase3Gate:
    def full_since(self, db: Database, days: float) -> None:
        sql(db, "UPDATE rollout_settings SET percent = 100, updated_at = now() - make_interval(secs => %s)",
            (days * 86400,))

    def test_at_one_percent_it_fails(self, db: Database, write_config: WriteConfig, seed: Seed) -> None:
        sql(db, "UPDATE rollout_settings SET percent = 1, updated_at = now() - interval '30 days'")
        samples(db, 14.1 * 24, step_s=60)
        code, report = gate(write_config(db), "phase3")
        assert (code, report["passed"], results(report)["rollout_percent"]) == (ExitCode.FAILURE, False, "fail")

    def test_a_week_at_100_percent_against_the_week_before(self, db: Database, write_config: WriteConfig) -> None:
        config = write_config(db)
        self.full_since(db, 8)
        samples(db, 14.1 * 24, step_s=60)
        alerts(db, 1, 9, 10)
        code, report = gate(config, "phase3")
        assert (code, report["verdict"]) == (0, "pass"), report["missing"]
        assert [c["value"] for c in report["criteria"][2:]] == [0.5, 1]
        alerts(db, 2, 3)
        code, report = gate(config, "phase3")
        assert (code, results(report)["alert_volume"]) == (ExitCode.FAILURE, "fail")

    def test_short_evidence_is_incomplete(self, db: Database, write_config: WriteConfig) -> None:
        config = write_config(db)
        self.full_since(db, 2)
        samples(db, 7.1 * 24, step_s=60)   # recorded for the window only, not the week before
        code, report = gate(config, "phase3")
        assert code == ExitCode.INCOMPLETE
        assert results(report) == {"window": "pass", "rollout_percent": "incomplete", "backlog_p99": "pass",
                                   "alert_volume": "incomplete"}
        assert report["missing"][0].startswith("rollout: at 100 % since")
        assert report["missing"][1].startswith("alert recording, the stretch before: nothing from")

    def test_a_slow_backlog_fails(self, db: Database, write_config: WriteConfig) -> None:
        self.full_since(db, 8)
        samples(db, 14.1 * 24, step_s=60, age=20.0)
        code, report = gate(write_config(db), "phase3")
        assert (code, results(report)["backlog_p99"]) == (ExitCode.FAILURE, "fail")
