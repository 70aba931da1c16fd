"""The dispatcher's side of the store: claim, record, breaker, release, upkeep.

Each method is one short transaction on a :class:`ManagedConnection`; none is
ever held open across an HTTP request.  A lost connection surfaces as
:class:`DatabaseUnavailable` and is reopened on the next call, so the caller
only decides how long to back off.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple, NoReturn

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from dispatcher.redact import storable
from dispatcher.rules.breaker import BreakerBatch, BreakerWrite, EndpointBreaker
from dispatcher.rules.health import BacklogFigures, BacklogRule
from dispatcher.rules.retry import HELD_EXPIRED, LAST_CHANCE_SPENT
from dispatcher.rules.wake import WakeMark
from dispatcher.signing import ROTATION_GRACE
from dispatcher.store import QUERIES, Connection, DatabaseUnavailable, connect, connect_each, named_rows
from dispatcher.store.errors import translate

_PARAMETER = re.compile(r"%\((\w+)\)s")


def backlog_figures(row: dict[str, Any]) -> BacklogFigures:
    """An ``engine_backlog`` row, by column name."""
    return BacklogFigures(overdue_rows=int(row["overdue_rows"]), oldest_age=row["oldest_age"],
                          held_rows=int(row["held_rows"]), open_breakers=int(row["open_breakers"]))


@dataclass(frozen=True, slots=True)
class _Plan:
    prepare: str   # PREPARE <name> AS <query with $1, $2, ...>
    execute: str   # EXECUTE <name> (%(first)s, %(second)s, ...)


# Statements whose best plan does not depend on how big the outbox looked when
# the plan was made: each reaches every table through a key, from rows in its
# own parameters.  They keep a plan per connection (plan_cache_mode auto:
# generic once it costs no more than a custom one), re-made when ANALYZE
# changes the statistics.  The claim's plan does depend on it (the class
# docstring), so it is made on every execution; so is the result write's
# (engine_record), whose plan names only the partitions of its ids (migration
# 0027): a generic plan holds every partition, and Postgres 15 locks them all
# at each execution before it prunes.
KEPT_PLANS = frozenset({"engine_breaker_touch"})
CLAIM_PLAN_MODE = "force_custom_plan"

# The engine's hot statements, each sent after SET LOCALs that keep its plan cheap whatever the
# outbox's statistics say.  SET LOCAL holds for the implicit transaction of the one round trip, so
# behind a transaction pooler too.
#
# No bitmap scans.  These statements reach the outbox only by key or by walking an index in order,
# and their plan must not hang on whether today's partition has statistics yet.  A day partition
# has none until autovacuum first analyses it, a minute or more into its day (or into a new
# region's life).  Until then the planner guesses a few rows where there are thousands and ANDs
# two bitmap scans (the due index and the window's id range on the primary key), then sorts,
# instead of walking the due index: a claim took 1.7 s and a result write 150 ms (the `sustained`
# scenario, docs/benchmarks.md).  Queries bounded by BRIN indexes (retention, the upkeep's
# figures) run elsewhere and keep bitmap scans, the only way to use those indexes.
#
# No JIT.  The claim's estimated cost passes jit_above_cost (100,000 by default) once the walk's
# row guesses grow with the outbox, and Postgres then compiled 274 functions for every claim:
# 300-800 ms of a CPU for a statement that runs in a few, 60 of the 106 s the claims took in
# `sustained` (docs/benchmarks.md).  Compiling never pays for statements this short.
#
# No constraint exclusion.  Both statements are planned at every execution, and partition pruning
# (by the claim's window, by the write's ids) already leaves out every partition they need not
# read, the DEFAULT one included.  On top of it the planner still tried to refute the DEFAULT
# partition's constraint (the negation of every other partition's bounds) for each of the claim's
# nine scans of the outbox: 17 % of the claim's planning, and about 7 % of Postgres' CPU per delivery
# in W1 (docs/benchmarks.md, "Planning the claim").  Turned off, the plans are the same.
GUARDED_PLANS = frozenset({"engine_claim", "engine_record"})
_PLAN_GUARD = "SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off; SET LOCAL constraint_exclusion = off; "


@functools.cache
def _plan(name: str) -> _Plan:
    """Query ``name`` as a server-side prepared statement: each distinct
    ``%(param)s`` becomes ``$n`` in order of first appearance."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    body = _PARAMETER.sub(number, QUERIES[name]).replace("%%", "%")
    arguments = ", ".join(f"%({param})s" for param in order)
    return _Plan(f"PREPARE {name} AS {body}", f"EXECUTE {name} ({arguments})")


class ManagedConnection:
    """One autocommit connection, opened on demand and dropped when it breaks.

    Round trips: psycopg2 opens each transaction with a BEGIN round trip of
    its own and ends it with a COMMIT round trip.  Every engine call but the
    breaker update is one statement, atomic by itself, so the connection runs
    in autocommit and such a call (:meth:`statement`) costs one round trip
    instead of three.  Calls that need several statements in one transaction
    use :meth:`transaction`, which sends BEGIN with the first statement and
    can send COMMIT with the last.

    The hot statements (claim, record, breaker touch) run as server-side
    prepared statements (:meth:`prepared`), so Postgres skips parsing and
    rewriting them; they are prepared again on each new connection.  The
    claim is still planned on every execution (``plan_cache_mode =
    force_custom_plan``; the others keep theirs: ``KEPT_PLANS``): a generic plan is made once, from the statistics of
    that moment, and kept.  Made while the outbox looked empty (a fresh table
    that autovacuum has not analysed yet) it probed every endpoint through
    webhook_deliveries_pending_age, filtering all due rows on each probe: claims
    of 0.6 s once one endpoint had 20k due rows (the isolation benchmark).
    """

    def __init__(self, dsn: str, application_name: str, connect_timeout: float = 5.0,
                 prepared_statements: bool = True,
                 bound: Callable[[float], AbstractContextManager[Any]] | None = None,
                 statement_deadline: float = 30.0) -> None:
        self._dsn = dsn
        # ``bound(seconds)`` limits a wait for the server and raises DatabaseUnavailable when it
        # passes: each server's connect (``connect_timeout``) and each call (``statement_deadline``).
        # A server that hangs, or a host gone silent, keeps the socket open, and a green process's
        # libpq applies no timeout of its own: without a bound a call would wait for TCP to give up
        # (minutes, or hours for a read).  The worker passes a gevent.Timeout; the store itself stays
        # free of gevent, and without a bound (the supervisor) libpq's blocking connect_timeout holds.
        self._bound = bound
        self._statement_deadline = statement_deadline
        self._application_name = application_name
        self._connect_timeout = connect_timeout
        self._use_prepared = prepared_statements
        self._conn: Connection | None = None
        self._prepared: set[str] = set()
        self._plan_mode: str | None = None  # the session's plan_cache_mode; None: not known

    def _deadline(self) -> AbstractContextManager[Any]:
        return nullcontext() if self._bound is None else self._bound(self._statement_deadline)

    def _connect(self) -> Connection:
        if self._bound is None:
            return connect(self._dsn, self._connect_timeout, self._application_name)
        bound = self._bound
        return connect_each(self._dsn, self._connect_timeout, self._application_name,
                            lambda: bound(self._connect_timeout))

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            conn = self._connect()
            conn.autocommit = True
            # Only prepared statements have cached plans.  Without them (behind a
            # transaction pooler) this session SET would be wrong twice over: it
            # would land on whichever server connection ran it, for other clients.
            if self._use_prepared:
                try:
                    with conn.cursor() as cur:
                        cur.execute(f"SET plan_cache_mode = {CLAIM_PLAN_MODE}")
                except psycopg2.Error as exc:
                    conn.close()
                    raise translate(exc) from None
            self._conn = conn
            self._prepared = set()
            self._plan_mode = CLAIM_PLAN_MODE
        return self._conn

    def prepared(self, cur: Any, name: str) -> str:
        """The EXECUTE text for query ``name``, PREPAREd on this connection at first use.

        With ``database.prepared_statements: false`` the query's own text: a
        transaction pooler (PgBouncer ``pool_mode = transaction``) runs each
        statement on any server connection, where our PREPARE may not exist
        (or already exist: 42P05).  Each execution is then parsed and planned.
        Either way, a statement of ``GUARDED_PLANS`` comes after its SET LOCALs.
        """
        guard = _PLAN_GUARD if name in GUARDED_PLANS else ""
        if not self._use_prepared:
            return guard + QUERIES[name]
        plan = _plan(name)
        if name not in self._prepared:
            cur.execute(plan.prepare)
            self._prepared.add(name)
        # The session's plan_cache_mode is read at each EXECUTE; switched only
        # when the statement wants the other one, in the same round trip.
        mode = "auto" if name in KEPT_PLANS else CLAIM_PLAN_MODE
        if mode == self._plan_mode:
            return guard + plan.execute
        self._plan_mode = mode
        return f"SET plan_cache_mode = {mode}; {guard}{plan.execute}"

    @contextmanager
    def statement(self) -> Iterator[Any]:
        """A cursor for self-contained statements: each one is its own transaction."""
        try:
            with self._connection().cursor() as cur, self._deadline():
                yield cur
        except psycopg2.Error as exc:
            self._raise(exc)
        except DatabaseUnavailable:
            self.close()  # the deadline passed mid-call: the session's state is unknown
            raise

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """An explicit transaction: committed on success, rolled back on any error."""
        tx = Transaction(self._connection().cursor())
        with self._deadline():
            try:
                yield tx
                tx.finish()
            except psycopg2.Error as exc:
                self._abort()
                self._raise(exc)
            except DatabaseUnavailable:
                self.close()  # the deadline passed: a ROLLBACK would wait for the same silent server
                raise
            except BaseException:
                self._abort()
                raise
            finally:
                tx.close()

    def _raise(self, exc: psycopg2.Error) -> NoReturn:
        """Raise the store error ``exc`` means.  A lost connection is dropped
        (reopened on the next call); a refused statement leaves it usable
        (autocommit, or rolled back by the caller), and the caller must still
        be told: an unexpected error class must never end a worker loop."""
        error = translate(exc)
        # A failed query string rolls back a SET sent with it: the mode is unknown, set again next time.
        self._plan_mode = None
        if isinstance(error, DatabaseUnavailable):
            self.close()
        raise error from None

    def _abort(self) -> None:
        conn = self._conn
        if conn is None or conn.closed:
            return
        try:
            if conn.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
                with conn.cursor() as cur:
                    cur.execute("ROLLBACK")
        except psycopg2.Error:
            self.close()  # a connection in an unknown state is not reused

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg2.Error:
                pass
        self._conn = None


class Transaction:
    """A cursor whose first statement carries BEGIN and whose last may carry COMMIT."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur
        self._begun = False
        self._committed = False

    def execute(self, sql: str, params: Any = None, commit: bool = False) -> None:
        """Run ``sql``; with ``commit`` the transaction ends with it (no more statements)."""
        if self._committed:
            raise RuntimeError("the transaction is already committed")
        text = sql if self._begun else "BEGIN;\n" + sql
        if commit:
            text = text.rstrip().rstrip(";") + ";\nCOMMIT"
        self._cur.execute(text, params)
        self._begun = True
        self._committed = commit

    def fetchall(self) -> list[dict[str, Any]]:
        return named_rows(self._cur)

    def finish(self) -> None:
        if self._begun and not self._committed:
            self._cur.execute("COMMIT")
            self._committed = True

    def close(self) -> None:
        self._cur.close()


@dataclass(frozen=True, slots=True)
class ClaimWindow:
    """The ids a claim reads, [floor, ceiling) (``dispatcher_claim_window``; docs/claim.md,
    "The claim's window"): the claim's scans are bounded by it, so its plan reads only the
    day partitions that can hold a pending row."""

    floor: int
    ceiling: int


# Every id: a claim without a window reads every partition (tests, benchmarks, tools).
EVERY_ID = ClaimWindow(-(2**63), 2**63 - 1)


class ClaimedRow(NamedTuple):
    """One claimed row, built straight from the claim's result tuple (:func:`claimed_rows`):
    a tuple type costs no per-field work to build, where a frozen dataclass set each of its
    fields through ``object.__setattr__`` (docs/benchmarks.md, "Claimed rows as tuples")."""

    id: int
    claim_token: int
    grants_slot: bool            # the claim took one of the endpoint's lane slots with this row
    endpoint_id: int
    event_id: str
    attempt: int                 # the number of the attempt about to be made (1-based)
    mode: str
    age: float                   # seconds since creation, less time held while paused, by the database clock
    db_now: float                # the database clock at the claim
    is_probe: bool
    event_type: str | None       # None: the event row is gone
    sequence: int | None
    occurred_at: str | None
    payload: str | None
    url: str | None              # None: the endpoint was deleted
    active: bool | None
    secret: str | None
    previous_secret: str | None
    workspace_id: str | None
    # Tracing (migration 0022; dispatcher/tracing.py): W3C carriers as the JSON text stored, None
    # when absent.  Text, not dicts: only a kept span needs them (tracing.carrier_of parses them).
    event_trace: str | None = None        # the producer's span when send() ran
    delivery_trace: str | None = None     # the delivery's own trace ({"traceparent", "replayed_from"})
    trace_headers: bool = True            # the endpoint's POSTs carry traceparent


class AttemptRecord(NamedTuple):
    """One finished attempt, ready for the batched result write: a tuple type, built once per
    attempt, at a third of a frozen dataclass's cost (docs/benchmarks.md, "The first sample")."""

    id: int
    claim_token: int
    endpoint_id: int
    status: str                  # the row's new status: pending, delivered, failed, dead
    attempt: int
    delay: float                 # seconds until the next attempt when status is pending
    error: str | None
    status_code: int | None
    result: str                  # attempt label: delivered, http_5xx, timeout, blocked, ...
    started_mono: float          # time.monotonic() when the attempt started
    duration_ms: int
    excerpt: str | None
    hold: float = 0.0            # seconds its lane slot stays taken after the attempt (limits.slot_hold)
    # The attempt span's traceparent (None: not traced), and whether it roots the delivery's trace
    # (its first traced attempt: engine_record keeps it on the row).
    traceparent: str | None = None
    trace_root: bool = False
    trace_id: str | None = None  # kept in the attempt history when the span was sampled


@dataclass(frozen=True, slots=True)
class SlotEntry:
    """What one of this process's lane-ledger entries holds now (docs/claim.md, "Holding a lane").

    ``keep`` slots stay held under the claim token ``token``; the rest go back,
    ``held`` of them only after ``hold`` more seconds (a timed-out attempt's slot).
    """

    endpoint_id: int
    token: int
    keep: int
    held: int = 0
    hold: float = 0.0


def slots_of(rows: Sequence[ClaimedRow]) -> list[SlotEntry]:
    """Every slot the claim of ``rows`` took, given back at once (a claim-per-batch loop's lanes)."""
    return [SlotEntry(endpoint_id, token, 0) for endpoint_id, token in
            sorted({(row.endpoint_id, row.claim_token) for row in rows if row.grants_slot})]


# engine_record reads each result by position (``r->>0`` is ``id``, ...): a JSON array per result,
# not an object.  Objects cost the worker twice as much to build and encode, and Postgres about as
# much again to take apart (json_to_recordset hashes each object's keys), for every result of every
# flush (docs/benchmarks.md, "Results by position").
RESULT_FIELDS = ("id", "token", "status", "attempt", "delay", "error", "status_code", "result", "started_ago",
                 "duration_ms", "excerpt", "endpoint_id", "traceparent", "trace_id")


def result_rows(records: Sequence[AttemptRecord], now: float) -> str:
    """``records`` as engine_record's results: a JSON array of arrays in :data:`RESULT_FIELDS`'
    order; ``now`` is time.monotonic(), from which each attempt's start is given as seconds ago."""
    return json.dumps([(r.id, r.claim_token, r.status, r.attempt, r.delay, storable(r.error), r.status_code,
                        r.result, now - r.started_mono, r.duration_ms, storable(r.excerpt), r.endpoint_id,
                        r.traceparent if r.trace_root else None, r.trace_id) for r in records],
                      separators=(",", ":"))


def claimed_rows(cur: Any) -> list[ClaimedRow]:
    """The claim's rows, matched to :class:`ClaimedRow`'s fields by column name: a SELECT list
    in another order is put back in the fields' order, never read by position alone, and a
    column missing or extra is an error naming it."""
    names = tuple(column.name for column in cur.description)
    make = ClaimedRow._make
    if names == ClaimedRow._fields:
        return [make(row) for row in cur.fetchall()]
    if sorted(names) != sorted(ClaimedRow._fields):
        missing = sorted(set(ClaimedRow._fields) - set(names))
        extra = sorted(set(names) - set(ClaimedRow._fields))
        raise ValueError(f"the claim's columns do not match ClaimedRow: missing {missing}, extra {extra}")
    reorder = itemgetter(*(names.index(name) for name in ClaimedRow._fields))
    return [make(reorder(row)) for row in cur.fetchall()]


class EngineStore:
    def __init__(self, conn: ManagedConnection) -> None:
        self._conn = conn

    @property
    def connection(self) -> ManagedConnection:
        """The connection it runs on (the upkeep leader's partition store shares it)."""
        return self._conn

    def claim(self, owner: str, limit: int, per_endpoint: int, busy: Sequence[int], after: int,
              lease: float, secret_grace: float = ROTATION_GRACE,
              refill: Sequence[tuple[int, int, bool]] = (), share: int | None = None,
              window: ClaimWindow = EVERY_ID) -> list[ClaimedRow]:
        """Claim due rows: up to ``limit`` by the endpoint walk (skipping ``busy``), each taking
        a lane slot, at most ``share`` (default ``per_endpoint``) of one endpoint; plus up to
        ``want`` more rows of each ``(endpoint_id, want, renew)`` in ``refill``, lanes this owner
        holds slots for already (those take none; ``renew``: the slots' lease is renewed).
        Only rows whose id is in ``window`` (:meth:`claim_window`) are read."""
        # A refilled lane is never walked too: its rows would be claimed twice in one statement.
        busy = sorted(set(busy).union(endpoint_id for endpoint_id, _, _ in refill))
        params = {"owner": owner, "limit": limit, "per_endpoint": per_endpoint, "busy": busy,
                  "share": per_endpoint if share is None else share,
                  "after": after, "lease": lease, "grace": secret_grace,
                  "floor": window.floor, "ceiling": window.ceiling,
                  "refill": json.dumps([{"endpoint_id": e, "want": w, "renew": r} for e, w, r in refill],
                                       separators=(",", ":"))}
        with self._conn.statement() as cur:
            cur.execute(self._conn.prepared(cur, "engine_claim"), params)
            rows = claimed_rows(cur)
        # The claim sends each event's payload once (on one of its rows): every
        # row of that event shares the one string, in memory as on the wire.  An
        # event is (workspace, id): ids are unique per workspace (migration 0009).
        payloads = {(row.workspace_id, row.event_id): row.payload for row in rows if row.payload is not None}
        return [row._replace(payload=payloads.get((row.workspace_id, row.event_id)))
                if row.payload is None and row.event_type is not None else row for row in rows]

    def claim_window(self) -> ClaimWindow:
        """The ids a claim needs to read now (``dispatcher_claim_window``): the worker asks every
        few seconds (``worker.CLAIM_WINDOW_REFRESH``) and passes it to :meth:`claim`."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_claim_window"])
            ((floor, ceiling),) = cur.fetchall()
            return ClaimWindow(int(floor), int(ceiling))

    def wake_mark(self) -> WakeMark:
        """The outbox's id sequence and the transactions in progress (``engine_wake_mark``),
        read by an idle worker between claims (``rules.wake``)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_wake_mark"])
            ((last_id, in_progress),) = cur.fetchall()
            return WakeMark(int(last_id), frozenset(in_progress))

    def record(self, records: Sequence[AttemptRecord], slots: Sequence[SlotEntry] = ()) -> set[int]:
        """Write a batch of results and what this process's lane entries hold now (``slots``);
        returns the ids the fence let through."""
        entries = [{"endpoint_id": e.endpoint_id, "token": e.token, "keep": e.keep, "held": e.held, "hold": e.hold}
                   for e in slots]
        with self._conn.statement() as cur:
            # The ids once more as an array literal (a string: cheaper than adapting a list), so
            # the update is planned for their partitions only.
            cur.execute(self._conn.prepared(cur, "engine_record"),
                        {"results": result_rows(records, time.monotonic()),
                         "slots": json.dumps(entries, separators=(",", ":")),
                         "ids": "{" + ",".join(str(r.id) for r in records) + "}"})
            return {row[0] for row in cur.fetchall()}

    def update_breakers(self, endpoint_ids: Sequence[int], batch: BreakerBatch) -> list[BreakerWrite]:
        """Lock the endpoints' breaker rows, let ``batch.decide(endpoint_id, breaker, db_now)``
        compute each new state (the pure rule), and write them back in the same transaction."""
        ids = sorted(set(endpoint_ids))
        with self._conn.transaction() as tx:
            # ensure + lock travel together: one round trip with the BEGIN, and
            # the write carries the COMMIT: two round trips per flush, not five.
            tx.execute(QUERIES["engine_breaker_ensure"] + "\n" + QUERIES["engine_breaker_lock"],
                       {"endpoint_ids": ids})
            writes: list[BreakerWrite] = []
            for row in tx.fetchall():
                stored = EndpointBreaker(row["state"], row["consecutive_failures"], row["open_until"])
                writes.append(batch.decide(row["endpoint_id"], stored, row["db_now"]))
            if writes:
                tx.execute(QUERIES["engine_breaker_write"], {
                    "endpoint_ids": [w.endpoint_id for w in writes],
                    "states": [w.breaker.state for w in writes],
                    "failures": [w.breaker.consecutive_failures for w in writes],
                    "open_until": [w.breaker.open_until for w in writes],
                    "opened": [w.opens_window for w in writes],
                    "succeeded": [w.succeeded for w in writes], "failed": [w.failed for w in writes],
                    "errors": [storable(w.error) for w in writes],
                }, commit=True)
        return writes

    def touch_closed_breakers(self, writes: Sequence[BreakerWrite]) -> set[int]:
        """Write closed -> closed breaker changes (``BreakerBatch.closed_writes``) where the
        row is still closed, in one statement (engine_breaker_touch); returns the
        endpoint ids it wrote."""
        if not writes:
            return set()
        writes = sorted(writes, key=lambda w: w.endpoint_id)  # the order the rows are visited in
        with self._conn.statement() as cur:
            try:
                cur.execute(self._conn.prepared(cur, "engine_breaker_touch"), {
                    "endpoint_ids": [w.endpoint_id for w in writes],
                    "failures": [w.breaker.consecutive_failures for w in writes],
                    "failed": [w.failed for w in writes], "errors": [storable(w.error) for w in writes],
                })
            except psycopg2.errors.DeadlockDetected:
                # Two flushes touching the same endpoints in different orders
                # (a plan that does not follow the id order): the statement was
                # rolled back whole, and the locking path, which locks in id
                # order, takes these endpoints instead.
                return set()
            return {row[0] for row in cur.fetchall()}

    def release(self, claims: Sequence[tuple[int, int]]) -> int:
        """Hand back claimed rows (id, token) that were never sent."""
        if not claims:
            return 0
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_release"], {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]})
            return len(cur.fetchall())

    def release_owner(self, owner: str) -> int:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_release_owner"], {"owner": owner})
            ((released,),) = cur.fetchall()
            return int(released)

    def hold_leadership(self, region: str, owner: str, lease: float) -> bool:
        """Take or renew the region's leader lease (``region_leader``); True while ``owner`` holds it.

        A lease row, not a session advisory lock: behind a transaction pooler a
        session lock lands on a shared server connection and means nothing.
        """
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_hold_leadership"], {"region": region, "owner": owner, "lease": lease})
            return bool(cur.fetchall())

    def backlog(self, rule: BacklogRule) -> BacklogFigures:
        """The backlog rule's figures (engine_backlog, shared with ``dispatcher check``)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_backlog"], {"row_age": rule.row_age, "threshold": rule.rows})
            (row,) = named_rows(cur)
            return backlog_figures(row)

    def record_backlog(self, figures: BacklogFigures, breaches: Sequence[str]) -> tuple[int, int]:
        """Keep the round's figures and open or close the backlog alert's episode;
        returns (episodes opened, episodes closed) by this round."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_record_backlog"], {
                "oldest_age": figures.oldest_age, "overdue_rows": figures.overdue_rows,
                "held_rows": figures.held_rows, "alerting": bool(breaches), "detail": "; ".join(breaches)})
            (row,) = named_rows(cur)
            return int(row["opened"]), int(row["cleared"])

    def prune_gate_evidence(self, older_than: float) -> None:
        """Delete backlog samples and closed alert episodes older than ``older_than`` seconds."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_prune_gate_evidence"], {"older_than": older_than})

    def prune_replay_jobs(self, older_than: float) -> int:
        """Delete bulk replay jobs finished more than ``older_than`` seconds ago (``replay_prune_jobs``)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["replay_prune_jobs"], {"older_than": older_than})
            return int(cur.rowcount)

    def open_breakers(self) -> list[tuple[int, str]]:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_open_breakers"])
            return [(int(r[0]), str(r[1])) for r in cur.fetchall()]

    def sweep_expired(self, ceiling: float, ceilings: Mapping[str, float], limit: int) -> int:
        """End up to ``limit`` rows whose last chance is spent (``breaker.last_chance_spent``)
        ``dead``; ``ceiling`` is the default retry ceiling, ``ceilings`` those of event
        types with a policy of their own.  Returns how many it ended."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_sweep_expired"], {
                "ceiling": ceiling, "ceilings": json.dumps(dict(ceilings)),
                "min_ceiling": min([ceiling, *ceilings.values()]), "limit": limit, "reason": LAST_CHANCE_SPENT})
            return len(cur.fetchall())

    def hold_stragglers(self) -> int:
        """Hold the pending rows a paused endpoint got from a producer that began before the pause."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_hold_stragglers"])
            return len(cur.fetchall())

    def release_unpaused(self) -> int:
        """Make pending the held rows whose endpoint is not paused (gone, or resumed around a producer)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_release_unpaused"])
            return len(cur.fetchall())

    def expire_held(self, hold_for: float, limit: int) -> int:
        """End up to ``limit`` rows held longer than ``hold_for`` seconds ``dead`` (``retry.HELD_EXPIRED``)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_expire_held"], {"hold_for": hold_for, "limit": limit,
                                                        "reason": HELD_EXPIRED})
            return len(cur.fetchall())

    def held_figures(self) -> tuple[int, int]:
        """(paused endpoints, held rows) across the region."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_held_figures"])
            (row,) = cur.fetchall()
            return int(row[0]), int(row[1])

    def prune_lapsed_leases(self) -> int:
        """Delete lane entries whose lease lapsed (they already count for nothing), and owner names
        retired more than a day ago (migration 0029); returns the lane entries deleted."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_prune_leases"])
            return int(cur.rowcount)

    def prune_deliveries(self, statuses: Sequence[str], older_than: float, batch: int) -> int:
        """Delete up to ``batch`` finished rows of the DEFAULT partition created more than ``older_than``
        seconds ago (day partitions are dropped whole)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_prune_deliveries"],
                        {"statuses": list(statuses), "older_than": older_than, "batch": batch})
            return int(cur.rowcount)

    def prune_attempts(self, older_than: float, batch: int) -> int:
        """The same for attempt history (DEFAULT partition only)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_prune_attempts"], {"older_than": older_than, "batch": batch})
            return int(cur.rowcount)

    def prune_events(self, older_than: float, batch: int) -> int:
        """The same for events no delivery row refers to any more (DEFAULT partition only)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["engine_prune_events"], {"older_than": older_than, "batch": batch})
            return int(cur.rowcount)

