"""Region-wide upkeep, done by exactly one process per region.

The process holding the region's leader lease (a ``region_leader`` row renewed
every round; it passes to another process when it lapses, or at once when
the supervisor releases a dead worker's claims) evaluates the backlog alert,
publishes the breaker gauges, sweeps rows whose retry window ran out while
their endpoint's breaker was open (claims skip those rows, so nothing else
would ever end them), and applies retention (decisions Q2): dead and failed
rows, delivered rows and attempt history are pruned in batches once they are
older than ``retention.*``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

from dispatcher.config import Config
from dispatcher.metrics import Metrics
from dispatcher.store.engine import EngineStore

log = logging.getLogger("dispatcher.upkeep")

SWEEP_BATCH = 1000
# Batches per upkeep round and table: with the default 5,000-row batch and a
# 10 s round that is up to 50,000 rows/s of pruning capacity, far above the
# 25 M/day (about 290/s) the outbox grows by, so a backlog of expired rows
# (after an outage of the upkeep leader, say) is worked off within minutes.
PRUNE_ROUNDS = 100
# The leader lease: this many upkeep rounds, and never shorter than the floor.
LEASE_ROUNDS = 3
LEASE_FLOOR = 30.0


class Upkeep:
    def __init__(self, config: Config, store: EngineStore, metrics: Metrics, owner: str = "") -> None:
        self._config = config
        self._store = store
        self._metrics = metrics
        self._policies = config.retry.retry_policies()
        self._owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        # Several rounds long, so a slow round (a big prune) does not let it lapse under a live leader.
        self._lease = max(LEASE_FLOOR, LEASE_ROUNDS * config.alerts.check_interval)
        self._is_leader = False
        self._alerting = False

    def run_once(self) -> None:
        leader = self._store.hold_leadership(self._config.region, self._owner, self._lease)
        if leader and not self._is_leader:
            log.info("this process now runs region upkeep for %s", self._config.region)
        elif self._is_leader and not leader:
            log.warning("this process lost the region upkeep lease for %s", self._config.region)
        self._is_leader = leader
        if not leader:
            return
        self._check_backlog()
        self._publish_breakers()
        self._sweep_expired()
        self._prune()

    def lost_connection(self) -> None:
        """The lease outlives a connection: the next round renews it (or finds it taken)."""

    def _check_backlog(self) -> None:
        alerts = self._config.alerts
        old_rows, oldest_age, _ = self._store.backlog(alerts.backlog_row_age, alerts.backlog_rows)
        self._metrics.gauge("webhook_backlog_age_seconds", oldest_age or 0.0)
        alerting = old_rows > alerts.backlog_rows or (oldest_age or 0.0) > alerts.oldest_pending_age
        self._metrics.gauge("webhook_backlog_alert", 1 if alerting else 0)
        if alerting:
            log.warning("backlog alert: %s pending rows due for more than %ds; oldest due row waits %.0fs",
                        f"over {alerts.backlog_rows}" if old_rows > alerts.backlog_rows else str(old_rows),
                        alerts.backlog_row_age, oldest_age or 0.0)
        elif self._alerting:
            log.info("backlog alert cleared")
        self._alerting = alerting

    def _publish_breakers(self) -> None:
        self._metrics.breakers((endpoint_id, state == "open") for endpoint_id, state in self._store.open_breakers())

    def _sweep_expired(self) -> None:
        ceilings = [self._policies.default.ceiling, *(p.ceiling for p in self._policies.by_event_type.values())]
        candidates = self._store.expired_candidates(min(ceilings), SWEEP_BATCH)
        expired = [row_id for row_id, event_type, age in candidates
                   if age >= self._policies.for_event_type(event_type).ceiling]
        if expired:
            count = self._store.mark_expired(expired)
            log.info("swept %d rows to dead: their retry window ended while the breaker was open", count)

    def _prune(self) -> None:
        """Q2: dead and failed rows are kept ``retention.dead`` after they ended
        (they end at most ``retry.ceiling`` after creation), delivered rows
        ``retention.delivered``, attempt history ``retention.attempts``."""
        retention = self._config.retention
        ceiling = max([self._policies.default.ceiling, *(p.ceiling for p in self._policies.by_event_type.values())])
        deleted = (self._prune_until_short(lambda: self._store.prune_deliveries(
                       ("dead", "failed"), retention.dead + ceiling, retention.batch))
                   + self._prune_until_short(lambda: self._store.prune_deliveries(
                       ("delivered",), retention.delivered, retention.batch))
                   + self._prune_until_short(lambda: self._store.prune_attempts(retention.attempts, retention.batch)))
        if deleted:
            log.info("retention: pruned %d rows", deleted)

    def _prune_until_short(self, prune_batch: Callable[[], int]) -> int:
        total = 0
        for _ in range(PRUNE_ROUNDS):
            deleted = prune_batch()
            total += deleted
            if deleted < self._config.retention.batch:
                break
        return total
