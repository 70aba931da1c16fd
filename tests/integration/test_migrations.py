"""Schema migrations against a real Postgres: idempotent, safe to run at once, and
producing the declared contract schema.

The contract tables are read and written directly by outside tools (issue 2),
so the columns below are declared here, by hand, from the issue: a migration
that renames or retypes one of them, or drops the RFC's partial index, fails
this file.  Later migrations may add tables and columns; an added column on a
contract table must be nullable or have a default, so that an outside tool's
INSERT naming only the contract columns keeps working.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg2
import psycopg2.errors
import pytest

from dispatcher import store
from tests.conftest import TestDatabase as Database

TIMESTAMPTZ = "timestamp with time zone"
SERIAL = object()  # marker: the default is a nextval() of the column's own sequence
DAY_ID = object()  # marker: the default is today's next id from the column's own sequence (0027)
TODAY = "dispatcher_today()"  # 0027: the UTC day, by the database clock


@dataclass(frozen=True)
class Column:
    type: str
    nullable: bool
    default: Any = None  # None: no default; SERIAL; or pg_get_expr() text


def required(type_: str, default: Any = None) -> Column:
    return Column(type_, False, default)


def optional(type_: str) -> Column:
    return Column(type_, True)


CONTRACT: dict[str, dict[str, Column]] = {
    "workspaces": {
        "id": required("text"),
        "secret": required("text"),
        "previous_secret": optional("text"),
        "secret_rotated_at": optional(TIMESTAMPTZ),
        "flags": required("jsonb", "'{}'::jsonb"),
        # 0011: the owner's email, and where breaker notices go as an operational webhook (issue 12 item 4)
        "owner_contact": optional("text"),
        "notify_webhook_url": optional("text"),
    },
    "webhook_endpoints": {
        "id": required("bigint", SERIAL),
        "workspace_id": required("text"),
        "url": required("text"),
        "event_types": required("text[]", "'{}'::text[]"),
        "active": required("boolean", "true"),
        "created_at": required(TIMESTAMPTZ, "now()"),
        # region-wide rate limit (0006); NULL: none
        "max_per_second": optional("double precision"),
        # 0011: the owner's email; an 'operational' row carries the workspace's notify webhook
        "owner_contact": optional("text"),
        "purpose": required("text", "'customer'::text"),
        # 0022: whether its POSTs carry traceparent/tracestate
        "trace_headers": required("boolean", "true"),
    },
    "events": {
        "id": required("text"),
        "workspace_id": required("text"),
        "type": required("text"),
        "sequence": required("bigint"),
        "occurred_at": required(TIMESTAMPTZ, "now()"),
        "payload": required("jsonb"),
        # 0022: the producer's W3C trace context
        "trace_context": optional("jsonb"),
        # 0025/0027: the day it was written, its partition's key
        "day": required("date", TODAY),
    },
    "webhook_deliveries": {
        # 0027: an id encodes its day (partitioned by id)
        "id": required("bigint", DAY_ID),
        "workspace_id": required("text"),
        "endpoint_id": required("bigint"),
        "event_id": required("text"),
        "payload_hash": required("text"),
        "attempt": required("integer", "0"),
        "status": required("text", "'pending'::text"),
        "next_attempt_at": required(TIMESTAMPTZ, "now()"),
        "last_error": optional("text"),
        "created_at": required(TIMESTAMPTZ, "now()"),
        # lease (claim ownership)
        "locked_by": optional("text"),
        "locked_until": optional(TIMESTAMPTZ),
        "delivered_at": optional(TIMESTAMPTZ),
        "last_status_code": optional("integer"),
        "replay_of": optional("bigint"),
        "mode": required("text", "'live'::text"),
        # 0022: the delivery's own trace (and a replay's original)
        "trace_context": optional("jsonb"),
        # 0025/0027: its event's day (the events partition it is in)
        "event_day": required("date", TODAY),
    },
    "webhook_delivery_attempts": {
        "id": required("bigint", DAY_ID),
        "delivery_id": required("bigint"),
        "endpoint_id": required("bigint"),
        "attempt": required("integer"),
        "started_at": required(TIMESTAMPTZ),
        "duration_ms": required("integer"),
        "result": required("text"),
        "status_code": optional("integer"),
        "error": optional("text"),
        "response_excerpt": optional("text"),
        "trace_id": optional("text"),  # 0022
    },
    # 0004: the rollout controls (issue 10).
    "rollout_settings": {
        "singleton": required("boolean", "true"),
        "percent": required("integer", "0"),
        "updated_at": required(TIMESTAMPTZ, "now()"),
    },
    "rollout_workspaces": {
        "workspace_id": required("text"),
        "list": required("text"),
        "updated_at": required(TIMESTAMPTZ, "now()"),
    },
    "endpoint_state": {
        "endpoint_id": required("bigint"),
        "state": required("text", "'closed'::text"),
        "consecutive_failures": required("integer", "0"),
        "open_until": optional(TIMESTAMPTZ),
        # 0011: counts closed -> open transitions; names the episode a notice is about
        "open_episode": required("bigint", "0"),
    },
    # 0011: one breaker notice per endpoint, episode and kind, and its mail's retry state.
    "breaker_notices": {
        "endpoint_id": required("bigint"),
        "episode": required("bigint"),
        "kind": required("text"),
        "workspace_id": required("text"),
        "created_at": required(TIMESTAMPTZ, "now()"),
        "attempts": required("integer", "0"),
        "next_attempt_at": Column(TIMESTAMPTZ, True, "now()"),
        "sent_at": optional(TIMESTAMPTZ),
        "recipient": optional("text"),
        "last_error": optional("text"),
    },
    # 0005: one row per dispatcher worker process (issue 11: status and check read the fleet from here).
    "dispatcher_processes": {
        "owner": required("text"),
        "region": required("text"),
        "host": required("text"),
        "pid": required("integer"),
        "started_at": required(TIMESTAMPTZ),
        "heartbeat_at": required(TIMESTAMPTZ, "now()"),
        "in_flight": required("integer", "0"),
        "leader_at": optional(TIMESTAMPTZ),
    },
}

PRIMARY_KEYS = {
    "workspaces": ("id",),
    "webhook_endpoints": ("id",),
    # 0009: event ids are unique per workspace; 0027: and day, the partition key (the producer also
    # looks into yesterday's partition: docs/producer.md, "Deduplication")
    "events": ("workspace_id", "id", "day"),
    "webhook_deliveries": ("id",),
    "webhook_delivery_attempts": ("id",),
    "endpoint_state": ("endpoint_id",),
    "dispatcher_processes": ("owner",),
    "rollout_settings": ("singleton",),
    "rollout_workspaces": ("workspace_id",),
    # 0007: one upkeep leader lease per region.
    "region_leader": ("region",),
    # 0011: the dedup key of breaker notices.
    "breaker_notices": ("endpoint_id", "episode", "kind"),
}

# (table, key columns, partial-index predicate, unique)
INDEXES = {
    # The RFC's due-row index.
    ("webhook_deliveries", ("next_attempt_at",), "(status = 'pending'::text)", False),
    # Sequences are never duplicated within a workspace (and day, the partition key: 0027).
    ("events", ("workspace_id", "sequence", "day"), None, True),
    # 0007: the region-wide replay budget reads the last hour of the ledger.
    ("api_replay_ledger", ("at",), None, False),
    # 0013: the region-wide lane ledger, read by (endpoint, claim).
    ("endpoint_leases", ("endpoint_id", "claim_token"), None, True),
    # 0011: at most one operational endpoint per workspace; due notices.
    ("webhook_endpoints", ("workspace_id",), "(purpose = 'operational'::text)", True),
    ("breaker_notices", ("next_attempt_at",), "(sent_at IS NULL)", False),
    # 0010: an endpoint's recent attempts (the endpoint list's 24 h rate, GET .../endpoints/stats).
    ("webhook_delivery_attempts", ("endpoint_id", "started_at"), None, False),
    # 0021: a retried bulk replay request finds its job; the replay loop finds running jobs.
    ("replay_jobs", ("workspace_id", "request_key"), None, True),
    ("replay_jobs", ("id",), "(state = 'running'::text)", False),
}

CHECKED_VALUES = {
    ("webhook_deliveries", "status"): {"pending", "held", "delivered", "failed", "dead", "shadow"},
    ("webhook_deliveries", "mode"): {"live", "shadow"},
    ("endpoint_state", "state"): {"closed", "open", "half_open"},
    ("rollout_workspaces", "list"): {"include", "exclude"},
    ("webhook_endpoints", "purpose"): {"customer", "operational"},
    ("breaker_notices", "kind"): {"opened", "will_pause", "paused", "expiring", "recovered"},
    ("replay_jobs", "state"): {"running", "done"},
    ("webhook_endpoints", "pause_cause"): {"customer", "operator", "lifecycle"},
    ("endpoint_lifecycle", "stage"): {"healthy", "failing", "will_pause", "paused"},
    # Re-created by 0020 and 0021: the later list must keep every action the earlier one added.
    ("api_audit", "action"): {"delivery.replay", "endpoint.recover", "endpoint.create", "endpoint.update",
                              "endpoint.delete", "endpoint.breaker_close", "endpoint.secret_rotate",
                              "workspace.update", "endpoint.pause", "endpoint.resume", "replay.bulk"},
}

FOREIGN_KEYS = {("webhook_endpoints", ("workspace_id",), "workspaces", ("id",)),
                ("rollout_workspaces", ("workspace_id",), "workspaces", ("id",))}

# The functions the named queries (dispatcher/sql/*.sql) call: signature -> (result, volatility).
FUNCTIONS = {
    # 0004: the rollout rule, shared by the producer and the API.
    "rollout_bucket(text)": ("integer", "i"),
    "webhook_outbox_on(jsonb,text,integer,integer)": ("boolean", "i"),
    # 0006 / 0013: the region-wide limits the claim applies.
    "dispatcher_bucket_after(double precision,double precision,double precision,bigint)": ("double precision", "i"),
    "dispatcher_lane_free(bigint,integer,double precision)": ("integer", "v"),
    # 0010: the signing secrets a claimed row is sent with.
    "dispatcher_signing_secrets(text,text,timestamp with time zone,text,text,timestamp with time zone,"
    "double precision)": ("text[]", "s"),
    # 0012, 0015, 0022: the producer's one statement (0022: the caller's trace context, defaulting to NULL).
    "dispatcher_send_event(text,text,text,timestamp with time zone,jsonb,text,boolean,double precision,jsonb)": (
        "TABLE(mode text, sequence bigint, deliveries integer, legacy_targets jsonb, legacy_payload text, "
        "skipped text)", "v"),
    # 0022: a sampled traceparent's trace id, for the API's history.
    "dispatcher_sampled_trace_id(text)": ("text", "i"),
    # 0014: the lease test (STABLE, so the planner inlines it) and the lane give-back.
    "dispatcher_unleased(timestamp with time zone)": ("boolean", "s"),
    # 0021: what a bulk replay re-queues (STABLE, inlined into the count, the sample and each batch).
    "dispatcher_replay_candidates(text,timestamp with time zone,timestamp with time zone,text[],bigint[],text[],"
    "bigint,bigint)": ("TABLE(id bigint, endpoint_id bigint, event_id text, event_type text, status text, "
                       "created_at timestamp with time zone, payload_hash text, event_day date)", "s"),
    # 0025: ids that encode their day (dispatcher/rules/partitions.py holds the twins).
    "dispatcher_today()": ("date", "s"),
    "dispatcher_first_id(date)": ("bigint", "i"),
    "dispatcher_day_of_id(bigint)": ("date", "i"),
    "dispatcher_next_id(regclass)": ("bigint", "v"),
    "dispatcher_partition_name(text,date)": ("text", "i"),
    # 0027: the upkeep's partitions ahead and the claim's window of ids.
    "dispatcher_ensure_partitions(integer)": ("SETOF text", "v"),
    "dispatcher_claim_window()": ("TABLE(floor bigint, ceiling bigint)", "s"),
}


# ---------------------------------------------------------------- catalog helpers


def catalog_columns(db: Database) -> dict[str, dict[str, Column]]:
    rows = db.query(
        """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid)
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
        """
    )
    tables: dict[str, dict[str, Column]] = {}
    for table, column, type_, nullable, default in rows:
        if default is not None and re.fullmatch(rf"nextval\('{table}_{column}_seq'::regclass\)", default):
            default = SERIAL
        elif default is not None and re.fullmatch(rf"dispatcher_next_id\('{table}_{column}_seq'::regclass\)", default):
            default = DAY_ID
        tables.setdefault(table, {})[column] = Column(type_, nullable, default)
    return tables


def catalog_indexes(db: Database) -> set[tuple[str, tuple[str, ...], str | None, bool]]:
    rows = db.query(
        """
        SELECT t.relname,
               ARRAY(SELECT pg_get_indexdef(ix.indexrelid, k + 1, true)
                       FROM generate_subscripts(ix.indkey, 1) AS k ORDER BY k),
               pg_get_expr(ix.indpred, ix.indrelid), ix.indisunique
          FROM pg_index ix
          JOIN pg_class t ON t.oid = ix.indrelid
          JOIN pg_namespace n ON n.oid = t.relnamespace
         WHERE n.nspname = 'public'
        """
    )
    return {(table, tuple(columns), predicate, unique) for table, columns, predicate, unique in rows}


Constraint = tuple[str, tuple[str, ...], str, str | None, tuple[str, ...]]


def catalog_constraints(db: Database, kind: str) -> list[Constraint]:
    """(table, columns, definition, referenced table, referenced columns) of constraints of one kind."""
    rows = db.query(
        """
        SELECT c.conrelid::regclass::text,
               ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
                       JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i),
               pg_get_constraintdef(c.oid),
               CASE WHEN c.confrelid <> 0 THEN c.confrelid::regclass::text END,
               ARRAY(SELECT a.attname FROM unnest(c.confkey) WITH ORDINALITY k(n, i)
                       JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.i)
          FROM pg_constraint c
          JOIN pg_namespace n ON n.oid = c.connamespace
         WHERE n.nspname = 'public' AND c.contype = %s
        """,
        (kind,),
    )
    return [(table, tuple(cols), definition, ref, tuple(ref_cols)) for table, cols, definition, ref, ref_cols in rows]


def applied(db: Database) -> list[tuple[int, str]]:
    return [(v, n) for v, n in db.query("SELECT version, name FROM schema_migrations ORDER BY version")]


def shipped() -> list[tuple[int, str]]:
    return [(m.version, m.name) for m in store.migrations()]


def migrate(db: Database) -> list[int]:
    conn = db.connect()
    try:
        return store.migrate(conn)
    finally:
        conn.close()


def pending(db: Database) -> list[int]:
    conn = db.connect()
    try:
        return store.pending_migrations(conn)
    finally:
        conn.close()


@pytest.fixture
def fresh(empty_db: Database) -> Database:
    """An empty database after one migrate from scratch."""
    migrate(empty_db)
    return empty_db


# ---------------------------------------------------------------- the migration files


class TestMigrationFiles:
    def test_every_sql_file_is_a_numbered_migration(self) -> None:
        # migrations() ignores names it does not recognise: a misnamed file would
        # silently never be applied.
        names = [entry.name for entry in resources.files("dispatcher.sql").joinpath("migrations").iterdir()
                 if entry.name.endswith(".sql")]
        assert names, "no migrations shipped"
        assert all(re.fullmatch(r"\d{4}_\w+\.sql", name) for name in names), names
        assert len(store.migrations()) == len(names)

    def test_versions_are_unique_and_start_at_one(self) -> None:
        versions = [m.version for m in store.migrations()]
        assert versions == sorted(set(versions))
        assert versions[0] == 1


# ---------------------------------------------------------------- applying them


class TestMigrate:
    def test_from_scratch_then_twice_more(self, empty_db: Database) -> None:
        versions = [v for v, _ in shipped()]
        assert pending(empty_db) == versions
        assert migrate(empty_db) == versions
        first = empty_db.query("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
        columns_before = catalog_columns(empty_db)

        assert migrate(empty_db) == []
        assert migrate(empty_db) == []

        assert empty_db.query("SELECT version, name, applied_at FROM schema_migrations ORDER BY version") == first
        assert applied(empty_db) == shipped()
        assert catalog_columns(empty_db) == columns_before
        assert pending(empty_db) == []

    def test_the_test_template_is_fully_migrated(self, db: Database) -> None:
        assert pending(db) == []
        assert applied(db) == shipped()

    @pytest.mark.parametrize("round_", range(3))
    def test_concurrent_migrates_apply_each_migration_once(self, empty_db: Database, round_: int) -> None:
        migrators = 4
        barrier = threading.Barrier(migrators)
        results: list[list[int]] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def run() -> None:
            conn = empty_db.connect()
            try:
                barrier.wait(timeout=30)
                done = store.migrate(conn)
                with lock:
                    results.append(done)
            except BaseException as exc:  # reported below, with the others
                with lock:
                    errors.append(exc)
            finally:
                conn.close()

        threads = [threading.Thread(target=run) for _ in range(migrators)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        assert len(results) == migrators
        counts = Counter(version for done in results for version in done)
        assert counts == Counter(v for v, _ in shipped()), "a migration was applied twice or not at all"
        assert applied(empty_db) == shipped()
        assert pending(empty_db) == []

    def test_up_to_applies_the_migrations_numbered_up_to_it_and_the_rest_later(self, empty_db: Database) -> None:
        """A region migrated in steps (docs/operations.md: 0025 and 0026 ahead of the swap), and tests
        of a migration that need the schema just before it."""
        versions = [v for v, _ in shipped()]
        step = versions[len(versions) // 2]
        conn = empty_db.connect()
        try:
            assert store.migrate(conn, up_to=step) == [v for v in versions if v <= step]
            assert store.migrate(conn, up_to=step) == []
            assert store.pending_migrations(conn) == [v for v in versions if v > step]
            assert store.migrate(conn) == [v for v in versions if v > step]
        finally:
            conn.close()
        assert applied(empty_db) == shipped()

    def test_a_failing_migration_leaves_the_earlier_ones_applied_and_itself_out(
        self, empty_db: Database, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = store.migrations()
        broken = store.Migration(real[-1].version + 1, "broken", "CREATE TABLE half_done (x int); SELECT 1/0;")
        after = store.Migration(real[-1].version + 2, "after", "CREATE TABLE after_broken (x int);")
        monkeypatch.setattr(store, "migrations", lambda: [*real, broken, after])
        conn = empty_db.connect()
        try:
            # The store's one error translator names the refused statement's SQLSTATE (22012: division_by_zero).
            with pytest.raises(store.QueryRejected, match="22012"):
                store.migrate(conn)
            # Each migration commits on its own: the earlier ones stay applied and recorded, the
            # broken one left nothing, and none after it ran.
            assert empty_db.query("SELECT to_regclass('half_done'), to_regclass('after_broken'), "
                                  "to_regclass('workspaces') IS NOT NULL") == [(None, None, True)]
            assert applied(empty_db) == [(m.version, m.name) for m in real]
            # The failed run gave the migrators' lock back: another one, on another connection, goes on.
            fixed = store.Migration(broken.version, "broken", "CREATE TABLE half_done (x int);")
            monkeypatch.setattr(store, "migrations", lambda: [*real, fixed, after])
            assert migrate(empty_db) == [broken.version, after.version]
        finally:
            conn.close()
        monkeypatch.undo()
        assert pending(empty_db) == []

    def test_a_migration_outside_a_transaction_runs_statement_by_statement(
        self, empty_db: Database, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = store.migrations()
        marker = store.OUTSIDE_A_TRANSACTION
        concurrent = store.Migration(real[-1].version + 1, "concurrently", f"""-- an index built concurrently
{marker}
CREATE INDEX CONCURRENTLY workspaces_flags ON workspaces USING gin (flags);
SELECT 1/0;
""")
        monkeypatch.setattr(store, "migrations", lambda: [*real, concurrent])
        with pytest.raises(store.QueryRejected, match="22012"):
            migrate(empty_db)
        # The statements before the failure are committed, the migration is not recorded: run again, it
        # runs every statement again (so each must be one that can: IF NOT EXISTS, or a DROP first).
        assert empty_db.query("SELECT to_regclass('workspaces_flags') IS NOT NULL") == [(True,)]
        assert applied(empty_db) == [(m.version, m.name) for m in real]
        fixed = store.Migration(concurrent.version, "concurrently", f"""{marker}
CREATE INDEX CONCURRENTLY IF NOT EXISTS workspaces_flags ON workspaces USING gin (flags);
""")
        monkeypatch.setattr(store, "migrations", lambda: [*real, fixed])
        assert migrate(empty_db) == [fixed.version]

    def test_a_migration_that_cannot_take_its_lock_in_time_says_run_it_again(
        self, empty_db: Database, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        migrate(empty_db)
        real = store.migrations()
        locking = store.Migration(real[-1].version + 1, "locking",
                                  "SET LOCAL lock_timeout = '50ms'; LOCK TABLE workspaces IN ACCESS EXCLUSIVE MODE;")
        monkeypatch.setattr(store, "migrations", lambda: [*real, locking])
        holder = empty_db.connect()
        try:
            with holder.cursor() as cur:
                cur.execute("LOCK TABLE workspaces IN ACCESS SHARE MODE")  # a long transaction's lock
            with pytest.raises(store.QueryRejected, match=r"run `dispatcher migrate` again") as refused:
                migrate(empty_db)
            assert refused.value.pgcode == "55P03"
        finally:
            holder.close()
        assert migrate(empty_db) == [locking.version]


# ---------------------------------------------------------------- the declared schema


class TestDeclaredSchema:
    def test_contract_columns(self, fresh: Database) -> None:
        actual = catalog_columns(fresh)
        problems = []
        for table, columns in CONTRACT.items():
            if table not in actual:
                problems.append(f"missing table {table}")
                continue
            for name, expected in columns.items():
                got = actual[table].get(name)
                if got != expected:
                    problems.append(f"{table}.{name}: expected {expected}, got {got}")
        assert not problems, "\n".join(problems)

    def test_added_columns_can_be_left_out_of_an_insert(self, fresh: Database) -> None:
        actual = catalog_columns(fresh)
        blocking = [
            f"{table}.{name}"
            for table, declared in CONTRACT.items()
            for name, column in actual[table].items()
            if name not in declared and not column.nullable and column.default is None
        ]
        assert not blocking, f"NOT NULL columns without a default break outside tools' INSERTs: {blocking}"

    def test_primary_keys(self, fresh: Database) -> None:
        keys = {table: columns for table, columns, *_ in catalog_constraints(fresh, "p")}
        for table, columns in PRIMARY_KEYS.items():
            assert keys.get(table) == columns, table

    def test_foreign_keys(self, fresh: Database) -> None:
        found = {(table, cols, ref, ref_cols) for table, cols, _, ref, ref_cols in catalog_constraints(fresh, "f")}
        assert FOREIGN_KEYS <= found

    def test_indexes(self, fresh: Database) -> None:
        found = catalog_indexes(fresh)
        assert INDEXES <= found, f"missing: {INDEXES - found}"

    def test_check_constraints_name_the_allowed_values(self, fresh: Database) -> None:
        allowed: dict[tuple[str, str], set[str]] = {}
        for table, cols, definition, _, _ in catalog_constraints(fresh, "c"):
            if len(cols) == 1:
                allowed[(table, cols[0])] = set(re.findall(r"'([^']*)'::text", definition))
        for key, values in CHECKED_VALUES.items():
            assert allowed.get(key) == values, key

    def test_functions(self, fresh: Database) -> None:
        found = {signature: (result, volatility) for signature, result, volatility in fresh.query(
            "SELECT p.oid::regprocedure::text, pg_get_function_result(p.oid), p.provolatile "
            "FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace")}
        assert {name: found.get(name) for name in FUNCTIONS} == FUNCTIONS

    def test_endpoint_limit_trigger(self, fresh: Database) -> None:
        rows = fresh.query(
            """
            SELECT t.tgname, t.tgtype, t.tgenabled, pg_get_triggerdef(t.oid)
              FROM pg_trigger t WHERE t.tgrelid = 'webhook_endpoints'::regclass AND NOT t.tgisinternal
            """
        )
        assert len(rows) == 1
        name, tgtype, enabled, definition = rows[0]
        row, before, insert, update = 1, 2, 4, 16  # pg_trigger.tgtype bits
        assert tgtype & (row | before | insert | update) == row | before | insert | update, definition
        assert enabled == "O", "trigger disabled"
        assert "UPDATE OF active" in definition

    def test_sequence_uniqueness_is_enforced(self, fresh: Database) -> None:
        fresh.query("INSERT INTO workspaces (id, secret) VALUES ('w', 's')")
        fresh.query("INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES ('e1', 'w', 't', 1, '{}')")
        with pytest.raises(psycopg2.errors.UniqueViolation):
            fresh.query("INSERT INTO events (id, workspace_id, type, sequence, payload) "
                        "VALUES ('e2', 'w', 't', 1, '{}')")


class TestOutsideTools:
    """What an outside tool sees: plain SQL naming only the contract columns."""

    def test_minimal_inserts_take_the_documented_defaults(self, fresh: Database) -> None:
        fresh.query("INSERT INTO workspaces (id, secret) VALUES ('w', 's')")
        (endpoint_id,) = fresh.query(
            "INSERT INTO webhook_endpoints (workspace_id, url) VALUES ('w', 'https://example.com/h') RETURNING id")[0]
        fresh.query("INSERT INTO events (id, workspace_id, type, sequence, payload) "
                    "VALUES ('e1', 'w', 'job.created', 1, '{\"a\": 1}')")
        fresh.query("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash) "
                    "VALUES ('w', %s, 'e1', 'h')", (endpoint_id,))
        assert fresh.query("SELECT flags FROM workspaces") == [({},)]
        assert fresh.query("SELECT event_types, active, created_at IS NOT NULL FROM webhook_endpoints") == [
            ([], True, True)]
        assert fresh.query(
            "SELECT status, attempt, mode, next_attempt_at <= now(), locked_by, locked_until, delivered_at, "
            "replay_of FROM webhook_deliveries") == [("pending", 0, "live", True, None, None, None, None)]

    @pytest.mark.parametrize(("column", "good", "bad"), [
        ("status", ["pending", "delivered", "failed", "dead"], "sent"),
        ("mode", ["live", "shadow"], "test"),
    ])
    def test_delivery_enums_are_checked(self, fresh: Database, column: str, good: list[str], bad: str) -> None:
        insert = (f"INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, {column}) "
                  "VALUES ('w', 1, 'e', 'h', %s)")
        for value in good:
            fresh.query(insert, (value,))
        with pytest.raises(psycopg2.errors.CheckViolation):
            fresh.query(insert, (bad,))

    def test_endpoint_limit_holds_for_raw_sql(self, fresh: Database) -> None:
        fresh.query("INSERT INTO workspaces (id, secret) VALUES ('w', 's')")
        insert = "INSERT INTO webhook_endpoints (workspace_id, url, active) VALUES ('w', 'https://e.example/', %s)"
        for _ in range(10):
            fresh.query(insert, (True,))
        fresh.query(insert, (False,))  # inactive endpoints do not count
        with pytest.raises(psycopg2.errors.CheckViolation, match="10 active endpoints"):
            fresh.query(insert, (True,))
        with pytest.raises(psycopg2.errors.CheckViolation):
            fresh.query("UPDATE webhook_endpoints SET active = true WHERE NOT active")
        # Another workspace has its own ten.
        fresh.query("INSERT INTO workspaces (id, secret) VALUES ('other', 's')")
        fresh.query("INSERT INTO webhook_endpoints (workspace_id, url) VALUES ('other', 'https://e.example/')")
        assert fresh.query("SELECT workspace_id, count(*) FROM webhook_endpoints WHERE active "
                           "GROUP BY 1 ORDER BY 1") == [("other", 1), ("w", 10)]

    def test_the_operational_endpoint_is_not_one_of_the_ten_and_is_one_per_workspace(self, fresh: Database) -> None:
        fresh.query("INSERT INTO workspaces (id, secret) VALUES ('w', 's')")
        insert = "INSERT INTO webhook_endpoints (workspace_id, url, purpose) VALUES ('w', 'https://e.example/', %s)"
        for _ in range(10):
            fresh.query(insert, ("customer",))
        fresh.query(insert, ("operational",))  # an eleventh active row, allowed: not a customer endpoint
        with pytest.raises(psycopg2.errors.UniqueViolation):
            fresh.query(insert, ("operational",))
        with pytest.raises(psycopg2.errors.CheckViolation):
            fresh.query(insert, ("customer",))


class TestRolloutSchema:
    def test_one_settings_row_starting_at_zero_percent(self, fresh: Database) -> None:
        assert fresh.query("SELECT percent FROM rollout_settings") == [(0,)]
        with pytest.raises(psycopg2.errors.UniqueViolation):
            fresh.query("INSERT INTO rollout_settings DEFAULT VALUES")

    @pytest.mark.parametrize("percent", [-1, 101])
    def test_percent_is_checked(self, fresh: Database, percent: int) -> None:
        with pytest.raises(psycopg2.errors.CheckViolation):
            fresh.query("UPDATE rollout_settings SET percent = %s", (percent,))

    def test_event_sequence_is_not_cached_per_session(self, fresh: Database) -> None:
        # A per-session cache would hand out numbers out of allocation order.
        assert fresh.query("SELECT cache_size FROM pg_sequences WHERE sequencename = 'event_sequence'") == [(1,)]
