"""Bounded database waits for a blocking (unpatched) process: the supervisor.

libpq's blocking calls take no deadline: ``connect_timeout`` bounds a
connect, but a query to a frozen primary, or to a host gone silent, waits for
TCP to give up (minutes, or hours for a read) -- and a supervisor waiting
there reaps, replaces and signals nothing.  Installed, :func:`wait_with_deadline`
makes psycopg2 run libpq without blocking and wait in ``select()`` itself,
until the deadline of the innermost :func:`blocking_bound` (none outside
one).  Past it, DatabaseUnavailable; psycopg2 closes the connection, and the
caller treats it as a lost one.  Green processes get the same from
``dispatcher.green_deadline.database_bound`` (a gevent timeout around psycogreen's
wait).  A signal during the wait runs its handler (which only queues it) and
the wait goes on (PEP 475).
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
    libpq's own ``connect_timeout`` no longer applies: connect inside a bound."""
    psycopg2.extensions.set_wait_callback(wait_with_deadline)
