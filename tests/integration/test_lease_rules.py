"""The lease rule has one definition (migration 0014): whether a delivery is
free of its lease (``dispatcher_unleased``).  A lane's slots go back in one
place too: engine_record's slot list (tests/integration/test_claim.py).

The queries call the functions instead of spelling the rules; this module
fails when a query spells the lease test by hand, when the boundary moves,
or when the planner stops inlining the test into the queries (the claim's
plan must stay what the spelled-out expression gave)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dispatcher.store import QUERIES
from dispatcher.store.engine import AttemptRecord, ManagedConnection, result_rows
from tests.conftest import TestDatabase as Database
from tests.support.partitions import canonical_plan

SQL = Path(__file__).resolve().parents[2] / "dispatcher" / "sql"

# A comparison of locked_until, either way round, or a coalesce() of it.
# Assignments (SET locked_until = ...) are not comparisons and do not match.
HAND_SPELLED = re.compile(
    r"\blocked_until\s*(?:<|>|!=|IS\b|BETWEEN\b)"
    r"|(?:<|>|=)\s*(?:\w+\.)?locked_until\b"
    r"|\b(?:coalesce|greatest|least)\s*\(\s*(?:\w+\.)?locked_until\b",
    re.IGNORECASE)
COMMENT = re.compile(r"--[^\n]*")
# schema.sql shows the function's own definition, the one place allowed to spell it.
DEFINITION = re.compile(r"CREATE (?:OR REPLACE )?FUNCTION public\.dispatcher_unleased\(.*?\$function\$.*?\$function\$",
                        re.DOTALL)

# Values for every parameter of the queries that call dispatcher_unleased, for EXPLAIN.
PARAMS: dict[str, Any] = {
    "owner": "w", "limit": 100, "per_endpoint": 4, "share": 4, "busy": [], "after": 0, "lease": 30.0, "grace": 0.0,
    "refill": '[{"endpoint_id": 1, "want": 4, "renew": true}]', "slots": "[]",
    "row_age": 60.0, "threshold": 100, "min_ceiling": 0.0, "ids": [1], "id": 1, "reason": "r",
    "ceiling": 86400.0, "ceilings": "{}", "cause": "operator",
    "floor": 0,  # engine_claim's window of ids is [floor, ceiling): any values do for a plan
}


def test_no_query_spells_the_lease_test_by_hand() -> None:
    files = sorted(SQL.glob("*.sql"))
    assert files, SQL
    found = []
    for path in files:
        text = COMMENT.sub("", path.read_text(encoding="utf-8"))
        text = DEFINITION.sub("", text)
        for line_number, line in enumerate(text.splitlines(), 1):
            if HAND_SPELLED.search(line):
                found.append(f"{path.name}:{line_number}: {line.strip()}")
    assert not found, ("compare locked_until only through dispatcher_unleased(locked_until) "
                       "(migration 0014):\n" + "\n".join(found))


def test_the_queries_use_the_one_definition() -> None:
    callers = {name for name, sql in QUERIES.items() if "dispatcher_unleased(" in sql}
    assert {"engine_claim", "engine_backlog", "engine_sweep_expired",
            "operations_pending", "operations_oldest_due", "api_end_pending", "api_close_breaker"} <= callers


def test_a_lease_is_over_at_its_stamp(db: Database) -> None:
    # One transaction: now() is the same instant in every expression.
    assert db.query(
        "SELECT dispatcher_unleased(NULL),"
        "       dispatcher_unleased(now() - interval '1 microsecond'),"
        "       dispatcher_unleased(now()),"
        "       dispatcher_unleased(now() + interval '1 microsecond')") == [(True, True, True, False)]


def test_the_lease_test_and_the_lane_ledger_agree_at_the_stamp(db: Database) -> None:
    # At T the row is free and its ledger entry no longer counts (0013's dispatcher_lane_free).
    db.query("INSERT INTO endpoint_leases (endpoint_id, claim_token, owner, leased, until) "
             "VALUES (1, 1, 'o', 4, now())")
    assert db.query("SELECT dispatcher_unleased(now()), dispatcher_lane_free(1, 4, NULL)") == [(True, 4)]


def test_the_lease_test_is_inlined_in_every_query(db: Database) -> None:
    callers = sorted(name for name, sql in QUERIES.items() if "dispatcher_unleased(" in sql)
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            for name in callers:
                cur.execute("EXPLAIN (VERBOSE, COSTS OFF) " + QUERIES[name], PARAMS)
                plan = "\n".join(row[0] for row in cur.fetchall())
                assert "dispatcher_unleased" not in plan, f"{name}: the planner calls the function\n{plan}"
                assert re.search(r"locked_until <= now\(\)", plan), f"{name}\n{plan}"
    finally:
        conn.rollback()
        conn.close()


def _claim_plan_over(db: Database, rows: int, endpoints: int) -> str:
    """EXPLAIN (COSTS OFF) of a claim over today's window, once ``rows`` pending deliveries over
    ``endpoints`` endpoints are written and analysed."""
    db.query("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash) "
             "SELECT 'w', 1 + i %% %s, 'e' || i, 'h' FROM generate_series(1, %s) i", (endpoints, rows))
    db.query("ANALYZE webhook_deliveries")
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET plan_cache_mode = force_custom_plan")
            cur.execute("SELECT floor, ceiling FROM dispatcher_claim_window()")
            (floor, ceiling), = cur.fetchall()  # the worker's window: today's partition holds the rows
            cur.execute("EXPLAIN (COSTS OFF) " + QUERIES["engine_claim"],
                        {**PARAMS, "floor": floor, "ceiling": ceiling})
            return "\n".join(row[0] for row in cur.fetchall())
    finally:
        conn.rollback()
        conn.close()


def test_the_claim_finds_its_rows_through_the_due_index(db: Database) -> None:
    plan = _claim_plan_over(db, rows=5000, endpoints=50)
    # A partition no row was ever written to (tomorrow's) has no page to read: a seq scan of it
    # costs nothing, and the planner rightly picks one.  Any other is a scan of the outbox.
    scanned = set(re.findall(r"Seq Scan on (webhook_deliveries\w*)", plan))
    assert not [name for name in scanned if db.query("SELECT relpages FROM pg_class WHERE relname = %s",
                                                     (name,)) != [(0,)]], plan
    plan = canonical_plan(db.dsn, plan)  # each partition's index named as its parent's
    assert "Index Scan using webhook_deliveries_due on webhook_deliveries" in plan, plan


def test_the_endpoint_walk_steps_through_the_due_index(db: Database) -> None:
    """Each step of the claim's walk finds the next endpoint with a pending row.  The outbox's
    (endpoint_id, id) index also serves ``endpoint_id > $1`` with the claim's window of ids, and
    at some sizes the planner preferred it: a step then read every delivered row of an endpoint
    before its first pending one (docs/claim.md, "Merged index entries")."""
    plan = canonical_plan(db.dsn, _claim_plan_over(db, rows=100_000, endpoints=1000))
    # Every scan of the outbox by endpoint: the walk's two starts and two steps, the probes, refills
    # and candidates.  (A step's plan is printed as a SubPlan, away from its CTE.)
    assert "webhook_deliveries_endpoint " not in plan, plan


def _plan_as_run(db: Database, name: str, params: dict[str, Any], prepared: bool,
                 explain: str = "COSTS OFF", session: str | None = None) -> str:
    """The plan of query ``name`` as the engine's connection runs it (``ManagedConnection.prepared``):
    its text, with EXPLAIN (``explain``: its options) before the statement itself; ``session``, SQL
    run on the connection first, as a server's or role's settings would be."""
    connection = ManagedConnection(db.dsn, "test", prepared_statements=prepared)
    try:
        with connection.statement() as cur:
            if session:
                cur.execute(session)
            text = connection.prepared(cur, name)
            # What comes before the statement (SET, SET LOCAL) runs as the engine runs it.
            if prepared:
                head, _, execute = text.rpartition("EXECUTE ")
                statement = "EXECUTE " + execute
            else:
                head, statement = text.removesuffix(QUERIES[name]), QUERIES[name]
            cur.execute(f"{head}EXPLAIN ({explain}) {statement}", params)
            return "\n".join(row[0] for row in cur.fetchall())
    finally:
        connection.close()


def _pending_outbox(db: Database, rows: int, endpoints: int, results: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write ``rows`` pending deliveries over ``endpoints`` endpoints, with no statistics taken; the
    parameters of a claim over today's window, and of a result write for the first ``results`` rows."""
    db.query("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash) "
             "SELECT 'w', 1 + i %% %s, 'e' || i, 'h' FROM generate_series(1, %s) i", (endpoints, rows))
    (floor, ceiling), = db.query("SELECT floor, ceiling FROM dispatcher_claim_window()")
    ids = [row[0] for row in db.query("SELECT id FROM webhook_deliveries ORDER BY id LIMIT %s", (results,))]
    written = result_rows([AttemptRecord(i, 1, 1, "delivered", 1, 0.0, None, None, "delivered", 99.9, 5, None)
                           for i in ids], 100.0)
    return {**PARAMS, "floor": floor, "ceiling": ceiling}, {"results": written, "slots": "[]", "ids": ids}


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "pooler"])
def test_the_claim_and_the_result_write_walk_indexes_on_a_partition_never_analysed(
        db: Database, prepared: bool) -> None:
    # Today's partition as in its first minute: thousands of rows, no statistics yet.  The
    # planner's guesses then favour bitmap scans ANDed and sorted (1.7 s a claim in `sustained`).
    claim_params, record_params = _pending_outbox(db, rows=8000, endpoints=200, results=200)
    claim = _plan_as_run(db, "engine_claim", claim_params, prepared)
    record = _plan_as_run(db, "engine_record", record_params, prepared)
    assert "Bitmap" not in claim, claim
    assert "Bitmap" not in record, record


def _claim_and_record_plans(db: Database, prepared: bool, explain: str, session: str) -> tuple[str, str]:
    """The plans of a claim and a result write over a small pending outbox, as the engine runs them
    on a connection where ``session`` ran first (a server's settings)."""
    claim_params, record_params = _pending_outbox(db, rows=400, endpoints=20, results=50)
    return (_plan_as_run(db, "engine_claim", claim_params, prepared, explain, session),
            _plan_as_run(db, "engine_record", record_params, prepared, explain, session))


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "pooler"])
def test_the_claim_and_the_result_write_are_never_compiled_by_jit(db: Database, prepared: bool) -> None:
    # A claim's estimated cost passes jit_above_cost (100,000 by default) once the walk's guesses
    # grow with the outbox; Postgres then compiled 274 functions for each such claim, 300-800 ms
    # of a CPU for a statement that runs in a few (60 s of `sustained`'s 106 s of claim time).
    # With jit_above_cost at 0 every statement would be compiled, unless the engine's own
    # SET LOCAL turns JIT off.  The Settings line shows that setting on any server, and where
    # the server can compile (pg_jit_available()), the JIT section is missing too.
    every_plan_compiled = "SET jit_above_cost = 0"
    for plan in _claim_and_record_plans(db, prepared, "ANALYZE, SETTINGS, COSTS OFF, TIMING OFF", every_plan_compiled):
        assert "jit = 'off'" in plan, plan
        assert "JIT:" not in plan, plan


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "pooler"])
def test_the_claim_and_the_result_write_prune_partitions_without_constraint_exclusion(
        db: Database, prepared: bool) -> None:
    # Planned at every execution, both statements leave the partitions they need not read to
    # partition pruning alone: refuting the DEFAULT partition's constraint as well cost 17 % of
    # the claim's planning (docs/benchmarks.md).  Even on a server set to constraint_exclusion = on,
    # the DEFAULT partition stays out of both plans.
    for plan in _claim_and_record_plans(db, prepared, "SETTINGS, COSTS OFF", "SET constraint_exclusion = on"):
        assert "constraint_exclusion = 'off'" in plan, plan
        assert "webhook_deliveries_default" not in plan, plan
        assert re.search(r"webhook_deliveries_p\d{8}", plan), plan

