"""Region-wide upkeep, done by exactly one process per region.

The process holding the region's leader lease (a ``region_leader`` row renewed
every round; it passes to another process when it lapses, or at once when
the supervisor releases a dead worker's claims) stamps its heartbeat row as
the leader's (``dispatcher status`` shows it, ``dispatcher check`` warns when
no leader ran a round lately), publishes the live-worker gauge, evaluates the
backlog alert by the rule ``dispatcher check`` uses too
(``dispatcher.rules.health.BacklogRule``) and keeps the round's figures and the
alert's episodes in the database for the rollout gates (``backlog_samples``,
``alert_episodes``), publishes the breaker gauges, ends the rows whose last
chance is spent (``dispatcher.rules.breaker.last_chance_spent``: past their
retry ceiling behind an open breaker that opened after it; claims skip those
rows, so nothing else would ever end them), keeps paused endpoints' rows
held and ends those held past ``endpoints.hold_for``, and applies retention
(docs/decisions.md, Q2): dead and failed rows, delivered rows and attempt
history are pruned in batches once they are older than ``retention.*``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

from dispatcher.config import Config
from dispatcher.metrics import Metrics
from dispatcher.store.engine import EngineStore
from dispatcher.store.operations import Presence

log = logging.getLogger("dispatcher.upkeep")

SWEEP_BATCH = 1000
# Batches per upkeep round, for each table pruned and for the sweep: with the
# default 5,000-row batch and a 10 s round that is up to 50,000 rows/s of
# pruning capacity, far above the 25 M/day (about 290/s) the outbox grows by,
# so a backlog of expired rows (after an outage of the upkeep leader, say) is
# worked off within minutes.
PRUNE_ROUNDS = 100
# The leader lease: this many upkeep rounds, and never shorter than the floor.
LEASE_ROUNDS = 3
LEASE_FLOOR = 30.0
# How long backlog samples and closed alert episodes are kept: phase 3's gate
# reads its week and the week before (docs/rollout.md), with room for a gate
# run late or over a longer window.
GATE_EVIDENCE_KEPT = 35 * 86400.0


class Upkeep:
    def __init__(self, config: Config, store: EngineStore, metrics: Metrics, presence: Presence | None = None,
                 owner: str = "") -> None:
        self._config = config
        self._store = store
        self._metrics = metrics
        self._presence = presence  # the leader's heartbeat row, stamped each round it holds the lease
        self._backlog_rule = config.alerts.backlog_rule()
        self._published: set[int] = set()  # endpoints whose breaker gauge this leader last set to 1
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
        self._mark_leader()
        self._check_backlog()
        self._publish_breakers()
        self._sweep_expired()
        self._keep_paused()
        self._store.prune_lapsed_leases()
        self._prune()

    @property
    def is_leader(self) -> bool:
        """Whether the last round held the region's lease (the breaker notices' periodic round follows it)."""
        return self._is_leader

    def lost_connection(self) -> None:
        """The lease outlives a connection: the next round renews it (or finds it taken)."""

    def _mark_leader(self) -> None:
        if self._presence is None:
            return
        alive = self._presence.mark_leader(self._config.alerts.heartbeat_age)
        self._metrics.gauges([("webhook_workers_alive", alive)])
        self._presence.prune()

    def _check_backlog(self) -> None:
        rule = self._backlog_rule
        figures = self._store.backlog(rule)
        breaches = rule.breaches(figures)
        self._metrics.gauges([("webhook_backlog_age_seconds", figures.oldest_age or 0.0),
                              ("webhook_backlog_overdue_rows", figures.overdue_rows),
                              ("webhook_backlog_held_rows", figures.held_rows),
                              ("webhook_backlog_alert", 1 if breaches else 0)])
        self._store.record_backlog(figures, breaches)
        if breaches:
            log.warning("backlog alert: %s; %d due rows wait behind %d open or half-open breakers (not backlog)",
                        "; ".join(breaches), figures.held_rows, figures.open_breakers)
        elif self._alerting:
            log.info("backlog alert cleared")
        self._alerting = bool(breaches)

    def _publish_breakers(self) -> None:
        """1 for every breaker not closed, 0 for those this leader set to 1
        before or that opened within the day: a gauge never sticks at 1."""
        states = dict(self._store.open_breakers())
        states.update({endpoint_id: "closed" for endpoint_id in self._published - states.keys()})
        self._metrics.breakers(sorted(states.items()))
        self._published = {endpoint_id for endpoint_id, state in states.items() if state != "closed"}

    def _sweep_expired(self) -> None:
        """docs/decisions.md, "Last chance": a row past its ceiling behind an open
        breaker waits for the breaker's probe; once the endpoint has failed an
        attempt after the row's ceiling, the row is ``dead``."""
        policies = self._policies
        ceilings = {event_type: p.ceiling for event_type, p in policies.by_event_type.items()}
        count = self._repeat_until_short(
            lambda: self._store.sweep_expired(policies.default.ceiling, ceilings, SWEEP_BATCH), SWEEP_BATCH)
        if count:
            log.info("swept %d rows to dead: their retry window ended and their endpoint failed again after it "
                     "(breaker open)", count)

    def _keep_paused(self) -> None:
        """Paused endpoints (migration 0020): hold the stragglers a producer wrote pending across the
        pause, release held rows whose endpoint is no longer paused (or gone), end the rows held longer
        than ``endpoints.hold_for`` (their owner was told beforehand), and publish the held gauges."""
        stragglers = self._store.hold_stragglers()
        if stragglers:
            log.info("held %d rows written pending for paused endpoints", stragglers)
        released = self._store.release_unpaused()
        if released:
            log.info("released %d held rows of endpoints no longer paused (deleted, or resumed during a send)",
                     released)
        expired = self._repeat_until_short(
            lambda: self._store.expire_held(self._config.endpoints.hold_for, SWEEP_BATCH), SWEEP_BATCH)
        if expired:
            log.warning("ended %d held rows dead: held longer than endpoints.hold_for while their endpoint was "
                        "paused", expired)
        paused, held = self._store.held_figures()
        self._metrics.gauges([("webhook_paused_endpoints", paused), ("webhook_held_rows", held)])

    def _prune(self) -> None:
        """Q2: dead and failed rows are kept ``retention.dead`` after they ended
        (they end at most ``retry.ceiling`` after creation, or, behind an open
        breaker, once a probe after it fails: up to ``breaker.open_for`` later),
        delivered rows and marked shadow rows ``retention.delivered``, attempt
        history ``retention.attempts``, finished bulk replay jobs ``retention.dead``."""
        retention = self._config.retention
        ceiling = max([self._policies.default.ceiling, *(p.ceiling for p in self._policies.by_event_type.values())])
        ended_by = ceiling + self._config.breaker.open_for
        deleted = (self._prune_until_short(lambda: self._store.prune_deliveries(
                       ("dead", "failed"), retention.dead + ended_by, retention.batch))
                   + self._prune_until_short(lambda: self._store.prune_deliveries(
                       ("delivered", "shadow"), retention.delivered, retention.batch))
                   + self._prune_until_short(lambda: self._store.prune_attempts(retention.attempts, retention.batch)))
        if deleted:
            log.info("retention: pruned %d rows", deleted)
        self._store.prune_gate_evidence(GATE_EVIDENCE_KEPT)
        self._store.prune_replay_jobs(retention.dead)

    def _prune_until_short(self, prune_batch: Callable[[], int]) -> int:
        return self._repeat_until_short(prune_batch, self._config.retention.batch)

    @staticmethod
    def _repeat_until_short(run_batch: Callable[[], int], batch: int) -> int:
        total = 0
        for _ in range(PRUNE_ROUNDS):
            done = run_batch()
            total += done
            if done < batch:
                break
        return total
