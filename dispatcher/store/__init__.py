"""The store: the one package that executes SQL.

Queries are data: they live in ``dispatcher/sql/*.sql`` as named blocks
(loaded and run by ``store.queries``) and the schema in numbered files under
``sql/migrations``.  This module holds the connection, migrations and the
workspace/endpoint admin writes; the other modules hold one kind of data
each: ``store.engine`` the dispatcher's claim and result writes,
``store.deliveries`` the delivery history, replay and recover, ``store.replays`` bulk replay by filter,
``store.endpoints`` endpoint state and changes, ``store.tokens`` API tokens,
``store.audit`` the audit log, ``store.rollout`` the rollout controls,
``store.operations`` heartbeats and status, ``store.notices`` breaker
notices, ``store.partitions`` the day partitions' upkeep.  Every error leaves
the store as a ``store.errors`` class.  Nothing outside this package runs SQL.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg2
import psycopg2.extensions

from dispatcher.signing import check_strength

# Imported under another name: ``store.audit`` stays the module (``store.audit.list_audit``).
from dispatcher.store.audit import Audit
from dispatcher.store.audit import audit as record_audit
from dispatcher.store.errors import (
    LOCK_NOT_AVAILABLE,
    Conflict,
    DatabaseUnavailable,
    LimitReached,
    NotFound,
    QueryRejected,
    QueryTimeout,
    ReplayLimited,
    SchemaOutdated,
    StoreError,
    limit_or,
    translated,
)
from dispatcher.store.queries import QUERIES, Connection, named_rows, query_rows, run_query, transaction

__all__ = [
    "QUERIES", "Audit", "Conflict", "Connection", "DatabaseUnavailable", "LimitReached", "NotFound", "QueryRejected",
    "QueryTimeout", "ReplayLimited", "SchemaOutdated", "StoreError", "connect", "connect_each", "named_rows",
    "query_rows", "run_query", "transaction", "translated",
]


# A migration file holding this line runs outside a transaction, each statement
# on its own (CREATE INDEX CONCURRENTLY refuses a transaction block); its
# statements end with ";" at the end of a line and hold no function bodies.
OUTSIDE_A_TRANSACTION = "-- migrate: each statement on its own"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def outside_a_transaction(self) -> bool:
        return OUTSIDE_A_TRANSACTION in self.sql.splitlines()

    def statements(self) -> list[str]:
        """The file's statements, one by one, comments left out."""
        found = []
        for chunk in re.split(r";[ \t]*$", self.sql, flags=re.MULTILINE):
            code = "\n".join(line for line in chunk.splitlines() if not line.lstrip().startswith("--")).strip()
            if code:
                found.append(code)
        return found


def migrations() -> list[Migration]:
    """The numbered migrations shipped in the package, in order."""
    found = []
    folder = resources.files("dispatcher.sql").joinpath("migrations")
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


def connect(dsn: str, connect_timeout: float = 5.0, application_name: str = "dispatcher") -> Connection:
    """Open a connection, turning libpq's multi-line failure into one line."""
    try:
        return psycopg2.connect(dsn, connect_timeout=max(1, int(connect_timeout)),
                                application_name=application_name)
    except psycopg2.OperationalError as exc:
        first_line = (str(exc).strip().splitlines() or ["unknown error"])[0]
        raise DatabaseUnavailable(f"cannot connect to the database: {first_line}") from None


def single_host_dsns(dsn: str) -> list[str]:
    """``dsn`` as one DSN per server it names, in libpq's order (``host=a,b port=1,2``
    gives two); a DSN naming one server comes back unchanged.  Every other parameter
    (``target_session_attrs`` included) is kept, so libpq still checks each server."""
    try:
        params = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return [dsn]  # let connect() report it
    hosts = params.get("host", "").split(",")
    addresses = params.get("hostaddr", "").split(",")
    if max(len(hosts), len(addresses)) < 2:
        return [dsn]
    count = max(len(hosts), len(addresses))
    ports = params.get("port", "").split(",")

    def nth(values: list[str], n: int) -> str:
        return values[n] if len(values) == count else values[0]  # one value applies to every server

    singles = []
    for n in range(count):
        single = {**params, "host": nth(hosts, n), "hostaddr": nth(addresses, n), "port": nth(ports, n)}
        singles.append(psycopg2.extensions.make_dsn(**{k: v for k, v in single.items() if v}))
    return singles


def connect_each(dsn: str, connect_timeout: float, application_name: str,
                 bound: Callable[[], AbstractContextManager[Any]]) -> Connection:
    """:func:`connect` to the servers of a multi-host DSN one at a time, each attempt within ``bound``.

    For green (gevent) processes: there libpq connects without blocking and
    does not apply ``connect_timeout`` itself, so a first server that accepts
    and then stays silent (hung, or its host gone) would hold the connect
    forever instead of libpq moving on to the next one.
    """
    failure = DatabaseUnavailable("cannot connect to the database: no server in the DSN")
    for single in single_host_dsns(dsn):
        try:
            with bound():
                return connect(single, connect_timeout, application_name)
        except DatabaseUnavailable as exc:
            failure = exc
    raise failure


def session_setup(conn: Connection, statement_timeout_ms: int) -> None:
    """Set the API session's statement timeout (a pooled connection, once when opened)."""
    with transaction(conn):
        run_query(conn, "api_session_setup", {"statement_timeout": str(statement_timeout_ms)})


def ping(conn: Connection) -> None:
    """One round trip: the database answers (``/healthz``)."""
    with transaction(conn):
        run_query(conn, "api_ping")


MIGRATE_LOCK_POLL = 0.2  # seconds between a waiting migrator's tries for the lock


def migrate(conn: Connection, sleep: Callable[[float], None] = time.sleep, up_to: int | None = None) -> list[int]:
    """Apply every migration not applied yet (``up_to``: only those numbered up to it); returns the
    versions applied now.

    Each migration commits on its own (with its row in schema_migrations), so a
    long run can be stopped and resumed, and one that fails leaves the earlier
    ones applied.  Safe to run concurrently: migrators take turns by a
    session-level advisory lock, and each reads what is applied once it holds
    it.  A waiting migrator polls for the lock rather than queueing on it: a
    queued one holds a snapshot, which a CREATE INDEX CONCURRENTLY of the
    migrator holding the lock would wait for -- a deadlock.
    """
    applied_now: list[int] = []
    _take_migrate_lock(conn, sleep)
    try:
        with transaction(conn):
            run_query(conn, "migrations_table")
            done = {row[0] for row in run_query(conn, "applied_migrations")}
        for migration in migrations():
            if up_to is not None and migration.version > up_to:
                break  # a region migrated in steps (docs/operations.md); the rest wait for the next run
            if migration.version not in done:
                _apply(conn, migration)
                applied_now.append(migration.version)
    finally:
        _release_migrate_lock(conn)
    return applied_now


def _take_migrate_lock(conn: Connection, sleep: Callable[[float], None]) -> None:
    while True:
        with transaction(conn):
            if run_query(conn, "migrate_try_lock")[0][0]:
                return
        sleep(MIGRATE_LOCK_POLL)


def _release_migrate_lock(conn: Connection) -> None:
    """Give the lock back; a connection that broke meanwhile took it with it."""
    if conn.closed:
        return
    try:
        with translated():
            conn.rollback()
        with transaction(conn):
            run_query(conn, "migrate_unlock")
    except StoreError:
        pass


def _apply(conn: Connection, migration: Migration) -> None:
    """One migration and its schema_migrations row: in one transaction, or (a file marked
    OUTSIDE_A_TRANSACTION) statement by statement, recorded once all of them ran."""
    try:
        if migration.outside_a_transaction:
            conn.autocommit = True
            try:
                with translated(), conn.cursor() as cur:
                    for statement in migration.statements():
                        cur.execute(statement)
            finally:
                conn.autocommit = False
            with transaction(conn):
                run_query(conn, "record_migration", {"version": migration.version, "name": migration.name})
            return
        with transaction(conn):
            with conn.cursor() as cur:
                cur.execute(migration.sql)
            run_query(conn, "record_migration", {"version": migration.version, "name": migration.name})
    except QueryRejected as exc:
        if exc.pgcode == LOCK_NOT_AVAILABLE:
            raise QueryRejected(f"migration {migration.version:04d}_{migration.name} gave up waiting for its "
                                "locks (lock_timeout: a long transaction holds the table); nothing of it was "
                                "applied: run `dispatcher migrate` again", exc.pgcode, exc.detail) from None
        raise


def pending_migrations(conn: Connection) -> list[int]:
    """Versions shipped with this code but not applied to the database."""
    with transaction(conn):
        exists = run_query(conn, "migrations_table_exists")[0][0]
        done = {row[0] for row in run_query(conn, "applied_migrations")} if exists else set()
    return [m.version for m in migrations() if m.version not in done]


def create_workspace(conn: Connection, workspace_id: str, secret: str, flags: Mapping[str, Any]) -> bool:
    """Create a workspace (or merge flags into an existing one); True if it existed."""
    with transaction(conn):
        rows = run_query(conn, "create_workspace",
                         {"id": workspace_id, "secret": secret, "flags": json.dumps(dict(flags))})
    return bool(rows[0][1])


def set_workspace_flags(conn: Connection, workspace_id: str, flags: Mapping[str, Any]) -> None:
    with transaction(conn):
        if not run_query(conn, "set_workspace_flag", {"id": workspace_id, "flags": json.dumps(dict(flags))}):
            raise NotFound(f"workspace {workspace_id!r} does not exist")


def set_workspace_contacts(conn: Connection, workspace_id: str, owner_contact: str | None,
                           notify_url: str | None, token_id: int | None = None) -> tuple[str | None, str | None]:
    """Set the workspace's owner email and operational webhook URL: None leaves
    one as it is, '' clears it.  Audited (``token_id`` None: an operator's CLI
    command).  Returns both as they now stand."""
    with transaction(conn):
        rows = run_query(conn, "set_workspace_contacts",
                         {"id": workspace_id, "owner_contact": owner_contact, "notify_url": notify_url})
        if rows:
            changed = [name for name, value in (("owner_contact", owner_contact), ("notify_webhook_url", notify_url))
                       if value is not None]
            record_audit(conn, Audit(workspace_id, token_id, "workspace.update", detail={"fields": changed}))
    if not rows:
        raise NotFound(f"workspace {workspace_id!r} does not exist")
    return rows[0][1], rows[0][2]


def workspace_contacts(conn: Connection, workspace_id: str) -> tuple[str | None, str | None, bool]:
    """The workspace's owner email and operational webhook URL (None: not set), and whether
    that owner confirmed by the mailed link (migration 0019)."""
    with transaction(conn):
        rows = run_query(conn, "workspace_contacts", {"id": workspace_id})
    if not rows:
        raise NotFound(f"workspace {workspace_id!r} does not exist")
    return rows[0][0], rows[0][1], bool(rows[0][2])


def rotate_workspace_secret(conn: Connection, workspace_id: str, secret: str) -> None:
    with transaction(conn):
        if not run_query(conn, "rotate_workspace_secret", {"id": workspace_id, "secret": secret}):
            raise NotFound(f"workspace {workspace_id!r} does not exist")


@dataclass(frozen=True, slots=True)
class NewEndpoint:
    """What registering an endpoint writes.  ``secret`` is the endpoint's own
    signing secret (docs/decisions.md, "Own secret per endpoint"): the caller
    makes it (``signing.new_secret``) and shows it once."""

    url: str
    secret: str
    event_types: Sequence[str] = ()
    max_per_second: float | None = None
    description: str | None = None
    active: bool = True
    owner_contact: str | None = None
    trace_headers: bool = True  # its POSTs carry traceparent/tracestate (migration 0022)


def add_endpoint(conn: Connection, workspace_id: str, url: str, event_types: Sequence[str], secret: str,
                 max_per_second: float | None = None, owner_contact: str | None = None) -> int:
    """Register an endpoint signing with ``secret``; the database enforces 10 active per workspace.
    ``max_per_second`` is its region-wide rate limit (None: none); ``owner_contact``
    the email its breaker notices go to (None: the workspace's owner)."""
    return register_endpoint(conn, workspace_id, NewEndpoint(url, secret, event_types, max_per_second,
                                                             owner_contact=owner_contact), token_id=None)


def register_endpoint(conn: Connection, workspace_id: str, new: NewEndpoint, token_id: int | None) -> int:
    """Insert ``new`` and its audit entry (by ``token_id``; None: an operator) in one transaction.

    Raises ``signing.WeakSecret``, writing nothing, unless ``new.secret`` carries
    at least ``signing.MIN_SECRET_BYTES`` key bytes."""
    check_strength(new.secret)
    try:
        with transaction(conn):
            if not run_query(conn, "workspace_exists", {"id": workspace_id}):
                raise NotFound(f"workspace {workspace_id!r} does not exist")
            rows = run_query(conn, "add_endpoint", {
                "workspace_id": workspace_id, "url": new.url, "event_types": list(new.event_types),
                "max_per_second": new.max_per_second, "owner_contact": new.owner_contact, "secret": new.secret,
                "description": new.description, "active": new.active, "trace_headers": new.trace_headers})
            endpoint_id = int(rows[0][0])
            record_audit(conn, Audit(workspace_id, token_id, "endpoint.create", endpoint_id))
    except QueryRejected as exc:
        raise limit_or(exc) from None
    return endpoint_id


def set_endpoint_active(conn: Connection, endpoint_id: int, active: bool) -> None:
    try:
        with transaction(conn):
            if not run_query(conn, "set_endpoint_active", {"id": endpoint_id, "active": active}):
                raise NotFound(f"endpoint {endpoint_id} does not exist")
    except QueryRejected as exc:
        raise limit_or(exc) from None


def delete_workspace_endpoints(conn: Connection, workspace_id: str) -> list[int]:
    """Delete every endpoint of the workspace as ``endpoints.delete_endpoint`` deletes one: pending rows
    end failed (``policy.ENDPOINT_DELETED``), never left for no one to deliver or see.  Returns the ids."""
    from dispatcher.store.endpoints import delete_workspace_endpoints as delete_all

    return delete_all(conn, workspace_id)


def delivery_status_counts(conn: Connection, endpoint_ids: Sequence[int]) -> dict[str, int]:
    with transaction(conn):
        return {str(status): int(n) for status, n in
                run_query(conn, "delivery_status_counts", {"endpoint_ids": list(endpoint_ids)})}
