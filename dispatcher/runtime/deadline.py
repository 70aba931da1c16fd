"""How long a process waits for the database: one bound, two mechanisms.

libpq applies no timeout of its own to a query whose server never answers,
and in a patched process not even ``connect_timeout``.  A hung or frozen
primary, or a host gone silent, keeps the socket open, so without a bound a
call would wait for TCP to give up (minutes, or hours for a read).  Every
process bounds its database waits by ``database.statement_deadline``:

* green (monkey-patched) processes, the workers and the API, wrap a wait in
  :func:`database_bound`, a gevent timeout around psycogreen's wait;
* the blocking supervisor installs :func:`wait_with_deadline` as psycopg2's
  wait callback (:func:`install_bounded_waits`): libpq runs without blocking
  and the wait happens in ``select()``, until the deadline of the innermost
  :func:`blocking_bound`.  A signal during the wait runs its handler (which
  only queues it) and the wait goes on (PEP 475).

Past the bound the caller gets DatabaseUnavailable and drops the connection as
a lost one.  The store stays free of both and takes the bound as a parameter.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gevent
import psycopg2.extensions

from dispatcher.store.errors import DatabaseUnavailable

_bound = threading.local()


def wait_with_deadline(conn: Any) -> None:
    """psycopg2's wait callback: ``psycopg2.extras.wait_select``, bounded."""
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        deadline: float | None = getattr(_bound, "deadline", None)
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise DatabaseUnavailable(f"no answer from the database within {_bound.seconds:g}s")
        if state == psycopg2.extensions.POLL_READ:
            select.select([conn.fileno()], [], [], remaining)
        elif state == psycopg2.extensions.POLL_WRITE:
            select.select([], [conn.fileno()], [], remaining)
        else:
            raise psycopg2.OperationalError(f"unexpected connection poll state {state}")


@contextmanager
def blocking_bound(seconds: float) -> Iterator[None]:
    """Database waits inside this block end after ``seconds`` with DatabaseUnavailable
    (once :func:`install_bounded_waits` has run in this process)."""
    outer = (getattr(_bound, "deadline", None), getattr(_bound, "seconds", None))
    deadline = time.monotonic() + seconds
    if outer[0] is None or deadline < outer[0]:
        _bound.deadline, _bound.seconds = deadline, seconds
    try:
        yield
    finally:
        _bound.deadline, _bound.seconds = outer


def install_bounded_waits() -> None:
    """Every psycopg2 wait of this process goes through :func:`wait_with_deadline`, and
    libpq's own ``connect_timeout`` does not apply to them: connect inside a bound."""
    psycopg2.extensions.set_wait_callback(wait_with_deadline)


def database_bound(seconds: float) -> gevent.Timeout:
    """A green wait for the database of at most ``seconds``: past it, DatabaseUnavailable, and the
    caller drops the connection as a lost one."""
    return gevent.Timeout(seconds, DatabaseUnavailable(
        f"no answer from the database within {seconds:g}s; reconnecting"))
