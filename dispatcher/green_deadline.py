"""How long a green (monkey-patched) process waits for the database.

In a patched process psycogreen makes libpq's I/O cooperative, and libpq then
applies no timeout of its own: not ``connect_timeout``, and nothing at all to
a query whose server never answers.  A hung or frozen primary, or a host gone
silent, keeps the socket open, so without a bound a call would wait for TCP
to give up (minutes, or hours for a read).  The workers and the API process
wrap their database waits in :func:`database_bound`; the store stays free of
gevent and takes the bound as a parameter.
"""

from __future__ import annotations

import gevent

from dispatcher.store import DatabaseUnavailable


def database_bound(seconds: float) -> gevent.Timeout:
    """A wait for the database of at most ``seconds``: past it, DatabaseUnavailable, and the
    caller drops the connection as a lost one."""
    return gevent.Timeout(seconds, DatabaseUnavailable(
        f"no answer from the database within {seconds:g}s; reconnecting"))
