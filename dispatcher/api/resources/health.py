"""``/healthz``: the process serves and its database answers."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import falcon

from dispatcher import store
from dispatcher.api.pool import ConnectionPool
from dispatcher.api.resources.base import Resource

# /healthz answers from a ping at most this old: a flood of probes costs one
# database round trip per second, not one each.
HEALTH_TTL = 1.0


class Health(Resource):
    """GET /healthz: the process serves and its database answers."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.ctx.health.check()
        resp.media = {"status": "ok"}


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
