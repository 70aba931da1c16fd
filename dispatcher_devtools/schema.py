"""Render a migrated database's schema as one readable SQL file.

``python -m dispatcher_devtools.schema DSN > dispatcher/sql/schema.sql``
writes the schema of the database at DSN (migrated with ``dispatcher
migrate``) from its catalogs, without pg_dump, so it works against the
embedded pgserver too.  tests/integration/test_schema_snapshot.py holds the file to the
numbered migrations.  The migrator's own bookkeeping (``schema_migrations``)
is left out, and so are the rows migrations insert (data, not schema).

Covered: tables (partitioned ones and partitions included) with their
columns, defaults, storage options and constraints; sequences; indexes;
functions; triggers; views; comments.  Anything else in the schema (types,
policies, grants) is reported on stderr, so the file is never silently short.

Left out: partitions for one day (``<table>_pYYYYMMDD``, migration 0027 and
the upkeep leader make them), whose names depend on the day the database was
migrated; partitioned tables, their ``*_before`` and ``*_default`` partitions are in.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions

Connection = psycopg2.extensions.connection

SCHEMA = "public"
LEFT_OUT = ("schema_migrations",)  # the migrator's bookkeeping, not the product's schema
DATED_PARTITION = "_p[0-9]{8}$"  # a partition for one day (a POSIX regular expression)

HEADER = """\
-- The dispatcher's schema as the numbered migrations (sql/migrations/) leave
-- it, in one file for readers.  Production migrates with the numbered files;
-- this is not applied anywhere but tests/integration/test_schema_snapshot.py, which
-- checks that the two agree.  Generated from a migrated database:
--     python -m dispatcher_devtools.schema DSN > dispatcher/sql/schema.sql
-- Not here: schema_migrations (the migrator's table) and the rows migrations
-- insert (rollout_settings' one row).

SET check_function_bodies = false;
"""

SERIAL_TYPES = {"bigint": "bigserial", "integer": "serial", "smallint": "smallserial"}
TYPE_MAX = {"bigint": 9223372036854775807, "integer": 2147483647, "smallint": 32767}


def rows(conn: Connection, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


@dataclass(frozen=True, slots=True)
class Table:
    oid: int
    name: str
    options: list[str] | None
    partition_key: str | None
    parent: str | None
    bound: str | None


def tables(conn: Connection) -> list[Table]:
    """Ordinary and partitioned tables, in creation order (the migrations' order), partitions after
    every other table (a legacy table attached as a partition is older than its parent); no dated
    partitions."""
    found = rows(conn, """
        SELECT c.oid, quote_ident(c.relname), c.reloptions,
               CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END,
               (SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = c.oid AND c.relispartition),
               CASE WHEN c.relispartition THEN pg_get_expr(c.relpartbound, c.oid) END
          FROM pg_class c
         WHERE c.relnamespace = %s::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> ALL (%s)
           AND NOT (c.relispartition AND c.relname ~ %s)
         ORDER BY c.relispartition, c.oid""", (SCHEMA, list(LEFT_OUT), DATED_PARTITION))
    return [Table(*row) for row in found]


def serial_columns(conn: Connection) -> dict[tuple[int, int], str]:
    """(table oid, column number) -> serial type, for columns a ``serial`` declaration
    gives exactly: a default-option sequence of the column's type, named
    ``<table>_<column>_seq``, owned by the column and used as its default."""
    found = rows(conn, """
        SELECT a.attrelid, a.attnum, format_type(a.atttypid, NULL)
          FROM pg_attribute a
          JOIN pg_class t ON t.oid = a.attrelid
          JOIN pg_depend d ON d.refobjid = a.attrelid AND d.refobjsubid = a.attnum AND d.deptype = 'a'
                          AND d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
          JOIN pg_class q ON q.oid = d.objid AND q.relkind = 'S'
          JOIN pg_sequence s ON s.seqrelid = q.oid
          JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
         WHERE t.relnamespace = %s::regnamespace AND a.attnotnull
           AND q.relname = t.relname || '_' || a.attname || '_seq'
           AND pg_get_expr(ad.adbin, ad.adrelid) = format('nextval(%%L::regclass)', quote_ident(q.relname))
           AND s.seqtypid = a.atttypid AND s.seqstart = 1 AND s.seqincrement = 1 AND s.seqmin = 1
           AND s.seqcache = 1 AND NOT s.seqcycle
           AND s.seqmax = CASE s.seqtypid WHEN 'int2'::regtype THEN 32767 WHEN 'int4'::regtype THEN 2147483647
                                          ELSE 9223372036854775807 END""", (SCHEMA,))
    return {(table, column): SERIAL_TYPES[type_] for table, column, type_ in found if type_ in SERIAL_TYPES}


def column_lines(conn: Connection, table: Table, serials: dict[tuple[int, int], str]) -> list[str]:
    found = rows(conn, """
        SELECT a.attnum, quote_ident(a.attname), format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
               CASE WHEN a.attcollation <> t.typcollation THEN a.attcollation::regcollation::text END
          FROM pg_attribute a
          JOIN pg_type t ON t.oid = a.atttypid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum""", (table.oid,))
    width = max((len(name) for _, name, *_ in found), default=0)
    lines = []
    for number, name, type_, not_null, default, identity, generated, collation in found:
        serial = serials.get((table.oid, number))
        parts = [name.ljust(width), serial or type_]
        if collation:
            parts.append(f"COLLATE {collation}")
        if identity:
            parts.append("GENERATED {} AS IDENTITY".format("ALWAYS" if identity == "a" else "BY DEFAULT"))
        elif generated:
            parts.append(f"GENERATED ALWAYS AS ({default}) STORED")
        elif default is not None and not serial:
            parts.append(f"DEFAULT {default}")
        if not_null and not serial and not identity:
            parts.append("NOT NULL")
        lines.append(" ".join(parts))
    return lines


def constraints(conn: Connection, table: Table) -> list[tuple[str, str, str | None, bool]]:
    """(name, definition, referenced table, valid): primary key and unique first, as a reader expects."""
    return [(name, definition, ref, valid) for name, definition, ref, valid in rows(conn, """
        SELECT quote_ident(conname), pg_get_constraintdef(oid),
               CASE WHEN confrelid <> 0 THEN confrelid::regclass::text END, convalidated
          FROM pg_constraint
         WHERE conrelid = %s AND contype NOT IN ('t', 'n') AND coninhcount = 0
         ORDER BY position(contype IN 'pucfx'), oid""", (table.oid,))]


def table_statement(conn: Connection, table: Table, serials: dict[tuple[int, int], str],
                    created: set[str]) -> tuple[str, list[str]]:
    """CREATE TABLE, and the constraints that must wait (NOT VALID ones, and
    foreign keys to tables created later) as ALTER TABLE statements."""
    name = table.name
    later = []
    inline = []
    for constraint, definition, referenced, valid in constraints(conn, table):
        clause = f"CONSTRAINT {constraint} {definition}"
        if not valid or (referenced is not None and referenced not in created):
            later.append(f"ALTER TABLE {name} ADD {clause};")
        else:
            inline.append(clause)
    if table.parent is not None:
        head = f"CREATE TABLE {name} PARTITION OF {table.parent}"
        body = " (\n    " + ",\n    ".join(inline) + "\n)" if inline else ""
        statement = f"{head}{body}\n    {table.bound}"
    else:
        elements = column_lines(conn, table, serials) + inline
        statement = f"CREATE TABLE {name} (\n    " + ",\n    ".join(elements) + "\n)"
    if table.partition_key:
        statement += f" PARTITION BY {table.partition_key}"
    if table.options:
        statement += f" WITH ({', '.join(table.options)})"
    return statement + ";", later


def sequences(conn: Connection, serials: dict[tuple[int, int], str]) -> tuple[list[str], list[str]]:
    """CREATE SEQUENCE for every sequence that neither a serial column nor an
    identity column declares, with the options that differ from the defaults;
    and the OWNED BY of those a column owns (to run once the tables exist)."""
    found = rows(conn, """
        SELECT quote_ident(q.relname), format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin,
               s.seqmax, s.seqcache, s.seqcycle, o.refobjid, o.refobjsubid,
               o.refobjid::regclass::text || '.' || (SELECT quote_ident(a.attname) FROM pg_attribute a
                                                      WHERE a.attrelid = o.refobjid AND a.attnum = o.refobjsubid)
          FROM pg_class q JOIN pg_sequence s ON s.seqrelid = q.oid
          LEFT JOIN pg_depend o ON o.objid = q.oid AND o.deptype = 'a' AND o.classid = 'pg_class'::regclass
                               AND o.refclassid = 'pg_class'::regclass
         WHERE q.relnamespace = %s::regnamespace AND q.relkind = 'S'
           AND NOT EXISTS (SELECT 1 FROM pg_depend i WHERE i.objid = q.oid AND i.deptype = 'i')
         ORDER BY q.oid""", (SCHEMA,))
    statements, ownerships = [], []
    for name, type_, start, increment, minimum, maximum, cache, cycle, table, column, owner in found:
        if (table, column) in serials:
            continue
        options = [f"AS {type_}" if type_ != "bigint" else "", f"START {start}" if start != 1 else "",
                   f"INCREMENT {increment}" if increment != 1 else "", f"MINVALUE {minimum}" if minimum != 1 else "",
                   f"MAXVALUE {maximum}" if maximum != TYPE_MAX.get(type_) else "",
                   f"CACHE {cache}" if cache != 1 else "", "CYCLE" if cycle else ""]
        statements.append(" ".join(["CREATE SEQUENCE", name, *filter(None, options)]) + ";")
        if table is not None:
            ownerships.append(f"ALTER SEQUENCE {name} OWNED BY {owner};")
    return statements, ownerships


def indexes(conn: Connection) -> list[str]:
    """Indexes not made by a constraint (those come with their CREATE TABLE) nor
    by a partitioned parent's index.  A partitioned table's index is written
    without ONLY, so that it makes its partitions' indexes as it did first."""
    return [f"{definition};" for (definition,) in rows(conn, """
        SELECT CASE WHEN t.relkind = 'p' THEN replace(pg_get_indexdef(i.indexrelid), ' ON ONLY ', ' ON ')
                    ELSE pg_get_indexdef(i.indexrelid) END
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
         WHERE c.relnamespace = %s::regnamespace AND t.relname <> ALL (%s)
           AND NOT EXISTS (SELECT 1 FROM pg_constraint k
                            WHERE k.conindid = i.indexrelid AND k.contype IN ('p', 'u', 'x'))
           AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)
         ORDER BY i.indexrelid""", (SCHEMA, list(LEFT_OUT)))]


def partition_index_options(conn: Connection) -> list[str]:
    """Storage options a partition's index holds apart from its parent's (0030: the due index's
    deduplicate_items): a partitioned index cannot take them, so each partition's index is altered."""
    return [f"ALTER INDEX {name} SET ({', '.join(options)});" for name, options in rows(conn, """
        SELECT c.oid::regclass::text, c.reloptions
          FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_class p ON p.oid = h.inhparent
          JOIN pg_index i ON i.indexrelid = c.oid JOIN pg_class t ON t.oid = i.indrelid
         WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'i' AND t.relname !~ %s
           AND c.reloptions IS DISTINCT FROM p.reloptions
         ORDER BY c.oid""", (SCHEMA, DATED_PARTITION))]


def functions(conn: Connection) -> tuple[list[str], list[str]]:
    """Functions in creation order: those a table may call (a column default), and those
    whose arguments or result name a table's row type, which must wait for the tables."""
    before: list[str] = []
    after: list[str] = []
    for definition, row_typed in rows(conn, """
        SELECT pg_get_functiondef(p.oid),
               EXISTS (SELECT 1 FROM unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]) || p.prorettype) a(t)
                         JOIN pg_type ty ON ty.oid = a.t
                         LEFT JOIN pg_type elem ON elem.oid = ty.typelem
                        WHERE ty.typrelid <> 0 OR coalesce(elem.typrelid, 0) <> 0)
          FROM pg_proc p
         WHERE p.pronamespace = %s::regnamespace AND p.prokind IN ('f', 'p')
           AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
         ORDER BY p.oid""", (SCHEMA,)):
        (after if row_typed else before).append(f"{definition.rstrip()};")
    return before, after


def views(conn: Connection) -> list[str]:
    return [f"CREATE {'MATERIALIZED ' if kind == 'm' else ''}VIEW {name} AS\n{definition.rstrip(';')};"
            for name, kind, definition in rows(conn, """
        SELECT quote_ident(c.relname), c.relkind, pg_get_viewdef(c.oid, true) FROM pg_class c
         WHERE c.relnamespace = %s::regnamespace AND c.relkind IN ('v', 'm') ORDER BY c.oid""", (SCHEMA,))]


def triggers(conn: Connection) -> list[str]:
    found = rows(conn, """
        SELECT pg_get_triggerdef(t.oid, true), t.tgenabled, t.tgrelid::regclass::text, quote_ident(t.tgname)
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = %s::regnamespace AND NOT t.tgisinternal AND t.tgparentid = 0
         ORDER BY t.oid""", (SCHEMA,))
    statements = []
    for definition, enabled, table, name in found:
        statements.append(f"{definition};")
        if enabled == "D":
            statements.append(f"ALTER TABLE {table} DISABLE TRIGGER {name};")
    return statements


def comments(conn: Connection) -> list[str]:
    return [f"COMMENT ON {target} IS {literal};" for target, literal in rows(conn, """
        SELECT CASE WHEN d.classoid = 'pg_proc'::regclass THEN 'FUNCTION ' || d.objoid::regprocedure::text
                    WHEN d.objsubid = 0 THEN 'TABLE ' || d.objoid::regclass::text
                    ELSE format('COLUMN %%s.%%I', d.objoid::regclass::text,
                                (SELECT attname FROM pg_attribute WHERE attrelid = d.objoid AND attnum = d.objsubid))
               END, quote_literal(d.description)
          FROM pg_description d
         WHERE (d.classoid = 'pg_class'::regclass
                AND (SELECT relnamespace FROM pg_class WHERE oid = d.objoid) = %s::regnamespace)
            OR (d.classoid = 'pg_proc'::regclass
                AND (SELECT pronamespace FROM pg_proc WHERE oid = d.objoid) = %s::regnamespace)
         ORDER BY d.classoid, d.objoid, d.objsubid""", (SCHEMA, SCHEMA))]


def unrendered(conn: Connection) -> list[str]:
    """Objects in the schema this module does not render (so the file would be short)."""
    return [f"{kind} {name}" for kind, name in rows(conn, """
        SELECT 'type', t.typname FROM pg_type t
         WHERE t.typnamespace = %s::regnamespace AND t.typtype IN ('e', 'd', 'r', 'm')
        UNION ALL
        SELECT 'type', t.typname FROM pg_type t JOIN pg_class c ON c.oid = t.typrelid
         WHERE t.typnamespace = %s::regnamespace AND c.relkind = 'c'
        UNION ALL
        SELECT 'policy', polname FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
         WHERE c.relnamespace = %s::regnamespace
        UNION ALL
        SELECT 'relation', relname FROM pg_class
         WHERE relnamespace = %s::regnamespace AND relkind = 'f'
        UNION ALL
        SELECT 'extension', extname FROM pg_extension WHERE extname <> 'plpgsql'""", (SCHEMA,) * 4)]


def render(conn: Connection) -> str:
    """The whole schema, in an order that loads: sequences, functions (a
    column default may call one; their bodies are not checked), tables, what
    must wait for all the tables (some constraints, sequence ownership),
    indexes, functions that take or return a table's row type, views,
    triggers, comments."""
    serials = serial_columns(conn)
    created_sequences, ownerships = sequences(conn, serials)
    created: set[str] = set()
    table_statements, deferred = [], []
    for table in tables(conn):
        statement, later = table_statement(conn, table, serials, created)
        created.add(table.name)
        table_statements.append(statement)
        deferred += later
    plain_functions, row_typed_functions = functions(conn)
    sections = [created_sequences, plain_functions, table_statements, deferred + ownerships, indexes(conn),
                partition_index_options(conn), row_typed_functions, views(conn), triggers(conn), comments(conn)]
    body = "\n\n".join("\n\n".join(section) for section in sections if section)
    return f"{HEADER}\n{body}\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dispatcher_devtools.schema DSN > dispatcher/sql/schema.sql", file=sys.stderr)
        return 2
    conn = psycopg2.connect(argv[0])
    try:
        conn.set_session(readonly=True)
        missing = unrendered(conn)
        if missing:
            print(f"not rendered (add them to dispatcher_devtools/schema.py): {', '.join(missing)}", file=sys.stderr)
            return 1
        sys.stdout.write(render(conn))
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
