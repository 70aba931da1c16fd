"""Named queries and the few ways the store runs one.

Queries are data: they live in ``dispatcher/sql/*.sql`` as named blocks
(``-- name: <query>``), loaded once into :data:`QUERIES`.  Rows come back as
tuples (:func:`run_query`, for single values) or as dicts keyed by column
name (:func:`query_rows`, :func:`named_rows`).  :func:`transaction` is the
one way a plain connection's statements run: driver errors leave it as the
store errors they mean (``store.errors.translate``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from types import MappingProxyType
from typing import Any

import psycopg2.extensions

from dispatcher.store.errors import translated

Connection = psycopg2.extensions.connection
Row = dict[str, Any]


def _load_queries() -> Mapping[str, str]:
    """Every named query of every ``sql/*.sql`` file; a name may appear once."""
    queries: dict[str, str] = {}
    for entry in sorted(resources.files("dispatcher.sql").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for block in re.split(r"^-- name: ", entry.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
            name, _, body = block.partition("\n")
            if name.strip() in queries:
                raise RuntimeError(f"query {name.strip()!r} is defined twice ({entry.name})")
            queries[name.strip()] = body.strip()
    return MappingProxyType(queries)


QUERIES = _load_queries()


def named_rows(cur: Any) -> list[Row]:
    """The cursor's rows keyed by column name (none when the statement returns no rows):
    reordering a SELECT list can then never silently swap two fields of the same type."""
    if cur.description is None:
        return []
    names = [column.name for column in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def run_query(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run a named query; rows as tuples, for single-value results (``rows[0][0]``)."""
    with conn.cursor() as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchall() if cur.description else []


def query_rows(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
    """Run a named query; each row as a dict keyed by the query's column names."""
    with conn.cursor() as cur:
        cur.execute(QUERIES[name], params)
        return named_rows(cur)


@contextmanager
def transaction(conn: Connection) -> Iterator[Connection]:
    """``with conn:`` (commit, or roll back on error) with driver errors --
    the commit's included -- raised as the store errors they mean."""
    with translated(), conn:
        yield conn
