"""The dispatcher's side of the store: claim, record, breaker, release, upkeep.

Each method is one short transaction on a :class:`ManagedConnection`; none is
ever held open across an HTTP request.  A lost connection surfaces as
:class:`DatabaseUnavailable` and is reopened on the next call, so the caller
only decides how long to back off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2

from dispatcher.policy import EndpointBreaker
from dispatcher.store import QUERIES, Connection, DatabaseUnavailable, connect

_LOST = (psycopg2.OperationalError, psycopg2.InterfaceError)


class ManagedConnection:
    """One connection, opened on demand and dropped when it breaks."""

    def __init__(self, dsn: str, application_name: str, connect_timeout: float = 5.0) -> None:
        self._dsn = dsn
        self._application_name = application_name
        self._connect_timeout = connect_timeout
        self._conn: Connection | None = None

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor inside one transaction; commit on success, drop on loss."""
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn, self._connect_timeout, self._application_name)
        conn = self._conn
        try:
            with conn, conn.cursor() as cur:
                yield cur
        except _LOST as exc:
            self.close()
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DatabaseUnavailable(f"database connection lost: {first_line}") from None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except _LOST:
                pass
        self._conn = None


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    id: int
    claim_token: int
    endpoint_id: int
    event_id: str
    attempt: int                 # the number of the attempt about to be made (1-based)
    mode: str
    age: float                   # seconds since creation, by the database clock
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


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One finished attempt, ready for the batched result write."""

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


@dataclass(frozen=True, slots=True)
class BreakerWrite:
    endpoint_id: int
    previous: EndpointBreaker
    breaker: EndpointBreaker
    succeeded: bool
    failed: bool
    error: str | None


class EngineStore:
    def __init__(self, conn: ManagedConnection) -> None:
        self._conn = conn

    def claim(self, owner: str, limit: int, per_endpoint: int, busy: Sequence[int], after: int,
              lease: float) -> list[ClaimedRow]:
        params = {"owner": owner, "limit": limit, "per_endpoint": per_endpoint, "busy": list(busy),
                  "after": after, "lease": lease}
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_claim"], params)
            return [ClaimedRow(*row) for row in cur.fetchall()]

    def record(self, records: Sequence[AttemptRecord]) -> set[int]:
        """Write a batch of results; returns the ids the fence let through."""
        now = time.monotonic()
        columns: Mapping[str, list[Any]] = {
            "ids": [r.id for r in records], "tokens": [r.claim_token for r in records],
            "statuses": [r.status for r in records], "attempts": [r.attempt for r in records],
            "delays": [r.delay for r in records], "errors": [r.error for r in records],
            "status_codes": [r.status_code for r in records], "results": [r.result for r in records],
            "started_ago": [now - r.started_mono for r in records], "durations_ms": [r.duration_ms for r in records],
            "excerpts": [r.excerpt for r in records], "endpoint_ids": [r.endpoint_id for r in records],
        }
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_record"], columns)
            return {row[0] for row in cur.fetchall()}

    def update_breakers(self, endpoint_ids: Sequence[int], decide: Any) -> list[BreakerWrite]:
        """Lock the endpoints' breaker rows, let ``decide(endpoint_id, breaker, db_now)`` compute
        each new state (a pure policy), and write them back in the same transaction."""
        ids = sorted(set(endpoint_ids))
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_breaker_ensure"], {"endpoint_ids": ids})
            cur.execute(QUERIES["engine_breaker_lock"], {"endpoint_ids": ids})
            writes: list[BreakerWrite] = []
            for endpoint_id, state, failures, open_until, db_now in cur.fetchall():
                write = decide(endpoint_id, EndpointBreaker(state, failures, open_until), db_now)
                if write is not None:
                    writes.append(write)
            if writes:
                cur.execute(QUERIES["engine_breaker_write"], {
                    "endpoint_ids": [w.endpoint_id for w in writes],
                    "states": [w.breaker.state for w in writes],
                    "failures": [w.breaker.consecutive_failures for w in writes],
                    "open_until": [w.breaker.open_until for w in writes],
                    "succeeded": [w.succeeded for w in writes], "failed": [w.failed for w in writes],
                    "errors": [w.error for w in writes],
                })
        return writes

    def release(self, claims: Sequence[tuple[int, int]]) -> int:
        """Hand back claimed rows (id, token) that were never sent."""
        if not claims:
            return 0
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_release"], {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]})
            return len(cur.fetchall())

    def release_owner(self, owner: str) -> int:
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_release_owner"], {"owner": owner})
            return len(cur.fetchall())

    def try_become_leader(self, region: str) -> bool:
        """Session-level advisory lock: held for as long as this connection lives."""
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_try_leader"], {"region": region})
            return bool(cur.fetchone()[0])

    def backlog(self, row_age: float, threshold: int) -> tuple[int, float | None, int]:
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_backlog"], {"row_age": row_age, "threshold": threshold})
            old_rows, oldest_age, open_breakers = cur.fetchone()
            return int(old_rows), oldest_age, int(open_breakers)

    def open_breakers(self) -> list[tuple[int, str]]:
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_open_breakers"])
            return [(int(r[0]), str(r[1])) for r in cur.fetchall()]

    def expired_candidates(self, min_ceiling: float, limit: int) -> list[tuple[int, str, float]]:
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_expired_candidates"], {"min_ceiling": min_ceiling, "limit": limit})
            return [(int(r[0]), str(r[1]), float(r[2])) for r in cur.fetchall()]

    def mark_expired(self, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        with self._conn.transaction() as cur:
            cur.execute(QUERIES["engine_mark_expired"], {"ids": list(ids)})
            return len(cur.fetchall())
