"""A small database connection pool for the API process.

One connection serves one request at a time.  The pool is built from
``threading`` primitives on purpose: ``dispatcher.runtime.api_main`` monkey-patches them, so
under gevent a request waiting for a connection yields to the hub instead of
blocking the process, while the unpatched test process (wsgiref threads,
schemathesis in-process) gets ordinary thread-safe behaviour from the same
code.  psycogreen makes the psycopg2 I/O itself cooperative.

Connections are opened lazily, so the app can start while the database is
down and serve 503 until it comes back.  A connection that fails with an
operational error is discarded, and so is every idle one (a restart of the
server kills them all; better one failed request than one per connection).

``bound(seconds)``, when given (``api_main`` passes ``dispatcher.runtime.deadline.database_bound``),
limits a request's whole use of its connection, opening it included, to
``deadline`` seconds (``database.statement_deadline``): the server's
``statement_timeout`` ends slow queries, but a frozen primary or a host gone
silent never answers at all, and a green libpq waits for it forever.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

import psycopg2
import psycopg2.extensions

from dispatcher import store

log = logging.getLogger(__name__)

T = TypeVar("T")
# After the standby failed a read, reads go to the primary this long before it is tried again.
STANDBY_RETRY = 5.0


class PoolTimeout(store.DatabaseUnavailable):
    """Every connection stayed busy for the whole wait."""


class ConnectionPool:
    def __init__(self, dsn: str, size: int, connect_timeout: float, statement_timeout: float,
                 application_name: str = "dispatcher-api",
                 bound: Callable[[float], AbstractContextManager[Any]] | None = None, deadline: float = 30.0) -> None:
        self._dsn = dsn
        self._bound = bound
        self._deadline = deadline
        self._application_name = application_name
        self._connect_timeout = connect_timeout
        self._statement_timeout_ms = max(1, int(statement_timeout * 1000))
        self._slots = threading.BoundedSemaphore(size)
        self._idle: collections.deque[store.Connection] = collections.deque()
        self._closed = False
        # Connections lent so far: what a route costs the database, for tests and operators.
        self.lent = 0

    def _open(self) -> store.Connection:
        conn = store.connect(self._dsn, self._connect_timeout, self._application_name)
        try:
            store.session_setup(conn, self._statement_timeout_ms)
        except store.StoreError:
            conn.close()
            raise
        return conn

    def _take(self) -> store.Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return self._open()

    def _give_back(self, conn: store.Connection) -> None:
        status = conn.info.transaction_status
        if self._closed or conn.closed or status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
            # A request that escaped its `with conn` block left a transaction
            # open (or the pool is shutting down): never hand that on.
            self._discard(conn)
            return
        self._idle.append(conn)

    def _discard(self, conn: store.Connection | None) -> None:
        if conn is not None and not conn.closed:
            try:
                conn.close()
            except psycopg2.Error:
                pass

    def _drain_idle(self) -> None:
        while self._idle:
            self._discard(self._idle.pop())

    @contextmanager
    def connection(self) -> Iterator[store.Connection]:
        """Lend a connection for one request; operational failures become DatabaseUnavailable."""
        if self._closed or not self._slots.acquire(timeout=self._connect_timeout):
            raise PoolTimeout("no database connection became free in time")
        self.lent += 1
        conn: store.Connection | None = None
        try:
            with self._bound(self._deadline) if self._bound is not None else nullcontext():
                conn = self._take()
                with store.translated():
                    yield conn
        except store.QueryTimeout:
            raise  # statement_timeout: the connection itself is healthy
        except store.DatabaseUnavailable as exc:
            log.warning("database connection failed: %s", exc)
            self._discard(conn)
            conn = None
            self._drain_idle()
            raise store.DatabaseUnavailable("the database is unavailable") from None
        finally:
            if conn is not None:
                self._give_back(conn)
            self._slots.release()

    def close(self) -> None:
        self._closed = True
        self._drain_idle()


class ReadRoute:
    """Where the API's history reads run: a streaming standby (``api.read_dsn``),
    falling back to the primary while the standby is down.

    A read that finds the standby unreachable (or loses its connection) is
    run again on the primary -- a read is safe to repeat -- and the next
    ``retry_after`` seconds of reads go straight to the primary, so a dead
    standby costs one failed attempt per period, not one per request.  A busy
    standby pool or a statement timeout is *not* a reason to move the load to
    the primary: those stay 503 problems.
    """

    def __init__(self, primary: ConnectionPool, standby: ConnectionPool, retry_after: float = STANDBY_RETRY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.primary = primary
        self.standby = standby
        self._retry_after = retry_after
        self._clock = clock
        self._standby_down_until = -float("inf")

    def run(self, read: Callable[[store.Connection], T]) -> T:
        """``read(conn)`` on the standby if it is up, else (or if it fails) on the primary."""
        if self._clock() >= self._standby_down_until:
            try:
                with self.standby.connection() as conn:
                    return read(conn)
            except (PoolTimeout, store.QueryTimeout):
                raise
            except store.DatabaseUnavailable:
                if self._clock() >= self._standby_down_until:
                    log.warning("the read standby (api.read_dsn) is unavailable; history reads go to the primary "
                                "for %.0fs before it is tried again event=read_standby_down", self._retry_after)
                self._standby_down_until = self._clock() + self._retry_after
        with self.primary.connection() as conn:
            return read(conn)

    def close(self) -> None:
        self.standby.close()


# /healthz answers from a ping at most this old: a flood of probes costs one
# database round trip per second, not one each.
HEALTH_TTL = 1.0


class HealthCheck:
    """The database's answer to a ping, reused for ``ttl`` seconds (a failure too).

    One caller pings at a time; callers arriving meanwhile wait for its answer
    rather than pinging themselves.
    """

    def __init__(self, pool: ConnectionPool, ttl: float = HEALTH_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()  # a gevent lock in the server: waiting yields
        self._checked_at = -math.inf
        self._healthy = False

    def _fresh(self) -> bool:
        return self._clock() - self._checked_at < self._ttl

    def check(self) -> None:
        """Return if the database answered recently; raise DatabaseUnavailable if it did not."""
        if not self._fresh():
            with self._lock:
                if not self._fresh():
                    self._healthy = self._ping()
                    self._checked_at = self._clock()
        if not self._healthy:
            raise store.DatabaseUnavailable("the database is unavailable")

    def _ping(self) -> bool:
        try:
            with self._pool.connection() as conn:
                store.ping(conn)
        except store.DatabaseUnavailable:
            return False
        return True
