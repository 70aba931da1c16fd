"""The store's errors, and the one rule that turns a driver error into one of them.

Every caller outside the store -- the engine, the API, the CLI -- sees only
:class:`StoreError` subclasses, phrased for one line of output.  Which driver
error means what is decided here and nowhere else (:func:`translate`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
import psycopg2.errorcodes
import psycopg2.errors


class StoreError(Exception):
    """A database problem phrased for one line of output."""


class DatabaseUnavailable(StoreError):
    """The database could not be reached (or the connection was lost)."""


class QueryTimeout(DatabaseUnavailable):
    """A statement ran past its statement_timeout; the connection itself is healthy."""


class QueryRejected(StoreError):
    """The database refused a statement (bad data, constraint, ...) but the connection is fine."""

    def __init__(self, message: str, pgcode: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.pgcode = pgcode
        self.detail = detail  # the server's primary message, for callers that rephrase it


class SchemaOutdated(StoreError):
    """The database lacks migrations this code needs."""


class NotFound(StoreError):
    """The named row does not exist."""


class Conflict(StoreError):
    """The request is well formed but the rows' state refuses it (HTTP 409)."""


class Unprocessable(StoreError):
    """The request names rows that do not exist where it must (HTTP 422), e.g. a filter's endpoint."""


class LimitReached(StoreError):
    """A database-enforced limit refused the write."""


class ReplayLimited(LimitReached):
    """The workspace's (or the region's) hourly replay budget would be exceeded (HTTP 429)."""

    def __init__(self, message: str, retry_after: int | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # None: the request can never fit


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def translate(exc: psycopg2.Error) -> StoreError:
    """The store error a driver error means.

    ``InternalError`` counts as a lost connection: a session that is read-only
    (a failover target not yet promoted, SQLSTATE 25006) or stuck in a failed
    transaction is unusable as it is; dropping it and reconnecting after a
    back-off lets the caller resume once the server takes writes.
    """
    if isinstance(exc, psycopg2.errors.QueryCanceled):
        return QueryTimeout("the database query took too long")
    if isinstance(exc, psycopg2.errors.LockNotAvailable):
        # lock_timeout (or NOWAIT) gave up on a lock: the statement is refused, the connection is fine.
        return QueryRejected(f"database refused the statement ({exc.pgcode}): {_first_line(exc)}", exc.pgcode,
                             getattr(getattr(exc, "diag", None), "message_primary", None))
    if isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError | psycopg2.InternalError):
        return DatabaseUnavailable(f"database connection lost: {_first_line(exc)}")
    if isinstance(exc, psycopg2.errors.UndefinedTable):
        return SchemaOutdated(f"database not migrated ({_first_line(exc)}): run `dispatcher migrate`")
    primary = getattr(getattr(exc, "diag", None), "message_primary", None)
    return QueryRejected(f"database refused the statement ({exc.pgcode or type(exc).__name__}): {_first_line(exc)}",
                         exc.pgcode, primary)


LOCK_NOT_AVAILABLE = psycopg2.errorcodes.LOCK_NOT_AVAILABLE  # 55P03: lock_timeout passed


def is_check_violation(exc: QueryRejected) -> bool:
    return exc.pgcode == psycopg2.errorcodes.CHECK_VIOLATION


def limit_or(exc: QueryRejected) -> StoreError:
    """``exc`` as LimitReached when it is the 10-active-endpoints trigger's
    refusal (a check_violation, migration 0001), else ``exc`` itself."""
    return LimitReached(exc.detail or "endpoint limit reached") if is_check_violation(exc) else exc


@contextmanager
def translated() -> Iterator[None]:
    """Raise driver errors from the block as the store errors they mean."""
    try:
        yield
    except psycopg2.Error as exc:
        raise translate(exc) from None
