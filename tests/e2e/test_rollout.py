"""Rollout controls (issue 10): the rule, its SQL twin, the CLI, the replay guard and the gate reports.

The CLI runs as a user runs it (a subprocess); gate data is seeded with SQL,
as the engine would have written it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
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
                         "mode) VALUES ('ws', %s, 'e1', 'h', 'shadow', 'shadow') RETURNING id", (endpoint,))
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

    def row(self, mode: str = "live", status: str = "delivered", attempt: int = 1, age_s: float = 60,
            finished_after_s: float | None = 0.5, first_attempt_after_s: float | None = 0.5,
            type_: str = "job.created", event_id: str | None = None, replay_of: int | None = None) -> int:
        self.n += 1
        event_id = event_id or f"e{self.n}"
        sql(self.db, "INSERT INTO events (id, workspace_id, type, sequence, payload, created_at) "
                     "VALUES (%s, 'ws', %s, %s, '{}', now() - %s) ON CONFLICT (workspace_id, id) DO NOTHING",
            (event_id, type_, self.n, timedelta(seconds=age_s)))
        (delivery,), = sql(self.db, """
            INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, mode, attempt,
                                            created_at, finished_at, replay_of)
            VALUES ('ws', %(ep)s, %(ev)s, 'h', %(status)s, %(mode)s, %(attempt)s, now() - %(age)s,
                    CASE WHEN %(fin)s::float8 IS NULL THEN NULL
                         ELSE now() - %(age)s + make_interval(secs => %(fin)s) END, %(replay_of)s)
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
                  FROM generate_series(1, %(rows)s) g RETURNING id
            ), d AS (
                INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, attempt,
                                                created_at, finished_at)
                SELECT 'ws', %(ep)s, id, 'h', 'delivered', 1, now() - interval '1 minute',
                       now() - interval '1 minute' + make_interval(secs => %(after)s) FROM ev
                RETURNING id, created_at
            )
            INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, duration_ms,
                                                   result, status_code)
            SELECT id, %(ep)s, 1, created_at + make_interval(secs => %(after)s), 10, 'delivered', 200 FROM d
            """, {"rows": rows, "ep": self.endpoint, "after": first_attempt_after_s})


@pytest.fixture
def seed(db: Database) -> Seed:
    return Seed(db)


def gate(config: Path, *args: str | Path) -> tuple[int, dict[str, Any]]:
    result = cli("-c", config, "gate", *args, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


class TestGates:
    def test_phase0(self, db: Database, write_config: WriteConfig, seed: Seed) -> None:
        config = write_config(db)
        for _ in range(20):
            seed.row(mode="shadow", status="shadow", finished_after_s=0.8)
        code, report = gate(config, "phase0")
        assert (code, report["passed"], report["value"]) == (0, True, 0.8)
        seed.row(mode="shadow", status="pending", finished_after_s=None, age_s=30)  # never marked: 30 s and counting
        code, report = gate(config, "phase0")
        assert (code, report["passed"]) == (ExitCode.FAILURE, False) and report["value"] > 5
        assert report["details"]["unmarked"] == 1

    def test_phase0_without_data_fails(self, db: Database, write_config: WriteConfig) -> None:
        code, report = gate(write_config(db), "phase0")
        assert (code, report["passed"], report["value"]) == (ExitCode.FAILURE, False, None)

    def test_phase1(self, db: Database, write_config: WriteConfig, seed: Seed, tmp_path: Path) -> None:
        config = write_config(db)
        for _ in range(3):
            seed.row()
        received = tmp_path / "received.txt"
        received.write_text("e1\ne2\ne3\nsomething-else\n")
        code, report = gate(config, "phase1", "--workspace", "ws", "--received", received)
        assert (code, report["passed"], report["value"]) == (0, True, 0)
        received.write_text("e1\n")
        code, report = gate(config, "phase1", "--workspace", "ws", "--received", received)
        assert (code, report["value"]) == (ExitCode.FAILURE, 2)
        assert [m["event_id"] for m in report["details"]["missing"]] == ["e2", "e3"]
        text = cli("-c", config, "gate", "phase1", "--workspace", "ws", "--received", received).stdout
        assert "missing: e2" in text and "missing: e3" in text and "FAIL" in text
        assert_one_line_error(cli("-c", config, "gate", "phase1", "--workspace", "ws", "--received",
                                  tmp_path / "absent.txt"), ExitCode.USAGE, "absent.txt")

    def test_phase2(self, db: Database, write_config: WriteConfig, seed: Seed) -> None:
        config = write_config(db, retry={"policies": {"technician.location": {"max_attempts": 1}}})
        seed.bulk(2000)
        seed.row(status="dead", attempt=1, type_="technician.location")  # one attempt is its policy
        retried = seed.row(status="dead", attempt=1)
        seed.row(status="delivered", event_id=f"e{seed.n}", replay_of=retried)  # later replayed successfully
        code, report = gate(config, "phase2")
        assert (code, report["passed"]) == (0, True), report
        assert report["details"]["never_retried"] == 0
        assert report["details"]["duplicate_sends"] == 0
        seed.row(status="failed", attempt=1)
        seed.row(status="dead", attempt=0)
        code, report = gate(config, "phase2")
        assert (code, report["passed"], report["details"]["never_retried"]) == (ExitCode.FAILURE, False, 2)

    def test_phase2_counts_duplicate_sends(self, db: Database, write_config: WriteConfig, seed: Seed) -> None:
        first = seed.row()
        seed.row(event_id="e1", replay_of=first)  # a second 2xx for the same event and endpoint
        code, report = gate(write_config(db), "phase2")
        assert report["details"]["duplicate_sends"] == 1

    def test_phase3(self, db: Database, write_config: WriteConfig, seed: Seed) -> None:
        config = write_config(db)
        seed.bulk(200, first_attempt_after_s=2)
        code, report = gate(config, "phase3")
        assert (code, report["passed"], report["value"]) == (0, True, 2.0)
        for _ in range(5):
            seed.row(first_attempt_after_s=40)
        code, report = gate(config, "phase3")
        assert (code, report["passed"]) == (ExitCode.FAILURE, False) and report["value"] > 15
