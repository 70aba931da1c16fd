"""dispatcher/sql/schema.sql is the schema the numbered migrations build.

One database is built by the migrations, one from schema.sql, and their
catalogs are compared object by object (tables, columns, constraints,
indexes, sequences, functions, triggers, views, partitioning, comments)
through catalog queries, not pg_dump, so this runs against the embedded
pgserver as well.  The generator (dispatcher_devtools.schema) is also run
over objects the product's schema does not use yet, so a future migration
that adds one finds it rendered.
"""

from __future__ import annotations

import difflib
import os
import pprint
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher_devtools import schema
from dispatcher_devtools.kit import scratch_database
from tests.conftest import TestDatabase as Database

SNAPSHOT = Path(__file__).resolve().parents[2] / "dispatcher" / "sql" / "schema.sql"
REGENERATE = ("dispatcher/sql/schema.sql does not match the migrations; regenerate it from a database "
              "migrated with the numbered files:\n"
              "    python -m dispatcher_devtools.schema DSN > dispatcher/sql/schema.sql")

# Each section: a query whose first column names the object and whose other
# columns describe it.  Objects are compared by name, so two databases built
# in different orders (OIDs, column numbers with holes left by dropped
# columns) still compare equal.
SECTIONS: dict[str, str] = {
    "tables": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions, c.relispartition,
               CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END,
               pg_get_expr(c.relpartbound, c.oid),
               (SELECT array_agg(i.inhparent::regclass::text ORDER BY i.inhseqno)
                  FROM pg_inherits i WHERE i.inhrelid = c.oid)
          FROM pg_class c
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')""",
    "columns": """
        SELECT format('%s.%s', c.relname, a.attname),
               row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
               format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
               a.attidentity, a.attgenerated, a.attcollation::regcollation::text, a.attstorage, a.attislocal
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
           AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraints": """
        SELECT format('%s.%s', c.conrelid::regclass::text, c.conname), c.contype,
               pg_get_constraintdef(c.oid), c.convalidated, c.condeferrable, c.condeferred,
               c.conislocal, c.coninhcount
          FROM pg_constraint c
         WHERE c.connamespace = 'public'::regnamespace""",
    "indexes": """
        SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisunique, i.indisprimary, i.indisvalid,
               c.reloptions
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE c.relnamespace = 'public'::regnamespace""",
    "sequences": """
        SELECT q.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax,
               s.seqcache, s.seqcycle,
               (SELECT format('%s.%s %s', d.refobjid::regclass::text, a.attname, d.deptype)
                  FROM pg_depend d
                  JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                 WHERE d.objid = q.oid AND d.classid = 'pg_class'::regclass
                   AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
          FROM pg_class q JOIN pg_sequence s ON s.seqrelid = q.oid
         WHERE q.relnamespace = 'public'::regnamespace""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
          FROM pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace AND p.prokind IN ('f', 'p')""",
    "aggregates and other routines": """
        SELECT p.oid::regprocedure::text, p.prokind
          FROM pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace AND p.prokind NOT IN ('f', 'p')""",
    "triggers": """
        SELECT format('%s.%s', t.tgrelid::regclass::text, t.tgname), pg_get_triggerdef(t.oid), t.tgenabled
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal""",
    "views": """
        SELECT c.relname, pg_get_viewdef(c.oid, true)
          FROM pg_class c
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('v', 'm')""",
    "types": """
        SELECT t.typname, t.typtype, format_type(t.typbasetype, t.typtypmod), t.typnotnull,
               (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid)
          FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
         WHERE t.typnamespace = 'public'::regnamespace AND t.typtype <> 'b'
           AND (c.oid IS NULL OR c.relkind = 'c')""",
    "comments": """
        SELECT format('%s %s %s', d.classoid::regclass::text,
                      CASE WHEN d.classoid = 'pg_proc'::regclass THEN d.objoid::regprocedure::text
                           ELSE d.objoid::regclass::text END,
                      d.objsubid), d.description
          FROM pg_description d
         WHERE (d.classoid = 'pg_class'::regclass AND d.objoid IN
                    (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace))
            OR (d.classoid = 'pg_proc'::regclass AND d.objoid IN
                    (SELECT oid FROM pg_proc WHERE pronamespace = 'public'::regnamespace))""",
}

# The migrator's own bookkeeping: created by store.migrate, not by a migration.
LEFT_OUT = ("schema_migrations", "schema_migrations_pkey", "schema_migrations.")
# Partitions for one day (webhook_deliveries_p20260131, its indexes and
# constraints): named by the day the database was migrated, so left out of
# schema.sql (dispatcher_devtools.schema.DATED_PARTITION).
DATED = re.compile(r"_p[0-9]{8}(?![0-9])")


def catalog(db: Database) -> dict[str, dict[str, tuple[Any, ...]]]:
    """Every section's objects, by name, without the migrator's bookkeeping."""
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            found = {}
            for section, sql in SECTIONS.items():
                cur.execute(sql)
                found[section] = {row[0]: tuple(row[1:]) for row in cur.fetchall()
                                  if not str(row[0]).startswith(LEFT_OUT) and not DATED.search(str(row[0]))}
            return found
    finally:
        conn.close()


def differences(expected: dict[str, dict[str, tuple[Any, ...]]],
                got: dict[str, dict[str, tuple[Any, ...]]]) -> list[str]:
    """A readable account of what differs, section by section."""
    problems = []
    for section in SECTIONS:
        want, have = expected[section], got[section]
        for name in sorted(want.keys() - have.keys()):
            problems.append(f"{section}: {name} is missing")
        for name in sorted(have.keys() - want.keys()):
            problems.append(f"{section}: {name} should not be there")
        for name in sorted(want.keys() & have.keys()):
            if want[name] != have[name]:
                diff = difflib.unified_diff(pprint.pformat(want[name]).splitlines(),
                                            pprint.pformat(have[name]).splitlines(), lineterm="", n=1)
                problems.append(f"{section}: {name} differs\n    " + "\n    ".join(diff))
    return problems


def load(db: Database, sql: str) -> None:
    conn = db.connect()
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def render(db: Database) -> str:
    conn = db.connect()
    try:
        assert schema.unrendered(conn) == []
        return schema.render(conn)
    finally:
        conn.close()


def test_schema_sql_matches_the_migrations(db: Database, empty_db: Database) -> None:
    load(empty_db, SNAPSHOT.read_text(encoding="utf-8"))
    problems = differences(catalog(db), catalog(empty_db))
    assert not problems, REGENERATE + "\n\n" + "\n".join(problems)


def test_the_query_loader_takes_nothing_from_it() -> None:
    # store._load_queries reads every sql/*.sql file as named queries.
    assert "\n-- name: " not in "\n" + SNAPSHOT.read_text(encoding="utf-8")


def test_the_comparison_sees_a_difference(db: Database, empty_db: Database) -> None:
    load(empty_db, SNAPSHOT.read_text(encoding="utf-8"))
    load(empty_db, "ALTER TABLE endpoint_leases ALTER COLUMN owner DROP NOT NULL;"
                   "CREATE OR REPLACE FUNCTION dispatcher_unleased(locked_until timestamptz) RETURNS boolean "
                   "LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT locked_until IS NULL OR locked_until < now() $$")
    problems = differences(catalog(db), catalog(empty_db))
    assert [p.split(" differs")[0] for p in problems] == [
        "columns: endpoint_leases.owner", "functions: dispatcher_unleased(timestamp with time zone)"]


def test_the_generator_renders_what_the_migrations_built(db: Database, empty_db: Database) -> None:
    # The file may be formatted by hand; what the generator writes today must load and agree too.
    load(empty_db, render(db))
    assert not differences(catalog(db), catalog(empty_db))


# Objects the product's schema does not use (yet), each of a kind the generator renders.
EXOTIC = """
CREATE SEQUENCE counters AS integer START 5 INCREMENT 2 MAXVALUE 1000 CACHE 3 CYCLE;
CREATE TABLE "Mixed Case" (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "Name" text COLLATE "C",
                           doubled int GENERATED ALWAYS AS (id * 2) STORED, small smallserial);
CREATE TABLE parent (id bigint NOT NULL, at date NOT NULL, child_ref int) PARTITION BY RANGE (at);
CREATE TABLE parent_2026 PARTITION OF parent FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE INDEX parent_at ON parent (at);
ALTER TABLE parent ADD CONSTRAINT parent_child FOREIGN KEY (child_ref) REFERENCES later (id);
CREATE TABLE owner_of_seq (n int);
ALTER TABLE owner_of_seq ADD CONSTRAINT positive CHECK (n > 0) NOT VALID;
ALTER SEQUENCE counters OWNED BY owner_of_seq.n;
CREATE VIEW recent AS SELECT id, at FROM parent WHERE at > date '2026-06-01';
CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER parent_touch BEFORE INSERT ON parent FOR EACH ROW EXECUTE FUNCTION touch();
CREATE TRIGGER owner_touch BEFORE UPDATE ON owner_of_seq FOR EACH ROW EXECUTE FUNCTION touch();
ALTER TABLE owner_of_seq DISABLE TRIGGER owner_touch;
COMMENT ON TABLE parent IS 'it''s partitioned';
COMMENT ON COLUMN "Mixed Case"."Name" IS 'quoted';
COMMENT ON FUNCTION touch() IS 'a trigger function';
"""


@pytest.fixture
def second_empty_db(pg_server_dsn: str) -> Iterator[Database]:
    with scratch_database(pg_server_dsn, f"dispatcher_e2_{os.getpid()}", replace=True) as database:
        yield database


def test_the_generator_round_trips_other_objects(empty_db: Database, second_empty_db: Database) -> None:
    # "later" is created after the table that references it: the foreign key must wait for it.
    load(empty_db, EXOTIC.replace("ALTER TABLE parent ADD CONSTRAINT",
                                  "CREATE TABLE later (id int PRIMARY KEY);\nALTER TABLE parent ADD CONSTRAINT"))
    load(second_empty_db, render(empty_db))
    assert not differences(catalog(empty_db), catalog(second_empty_db))
