"""Region-wide upkeep, done by exactly one process per region.

The process holding the region's advisory lock (session-level, so it passes
to another process when its connection dies) evaluates the backlog alert,
publishes the breaker gauges, sweeps rows whose retry window ran out while
their endpoint's breaker was open (claims skip those rows, so nothing else
would ever end them), and applies retention (decisions Q2): dead and failed
rows, delivered rows and attempt history are pruned in batches once they are
older than ``retention.*``.
"""

from __future__ import annotations

import logging
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


class Upkeep:
    def __init__(self, config: Config, store: EngineStore, metrics: Metrics) -> None:
        self._config = config
        self._store = store
        self._metrics = metrics
        self._policies = config.retry.retry_policies()
        self._is_leader = False
        self._alerting = False

    def run_once(self) -> None:
        if not self._is_leader:
            self._is_leader = self._store.try_become_leader(self._config.region)
            if not self._is_leader:
                return
            log.info("this process now runs region upkeep for %s", self._config.region)
        self._check_backlog()
        self._publish_breakers()
        self._sweep_expired()
        self._prune()

    def lost_connection(self) -> None:
        """The advisory lock went with the connection; campaign again."""
        self._is_leader = False

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
