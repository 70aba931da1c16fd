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
held and ends those held past ``endpoints.hold_for``, keeps the day
partitions (issue 25: ``dispatcher.rules.partitions``): creates them
``partitions.days_ahead`` ahead, drops whole the ones whose rows are all past
retention and reports the ones that wait, and prunes the DEFAULT partitions,
which catch rows whose day had no partition, in batches by the row-by-row
rules of retention (docs/decisions.md, Q2).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
from collections.abc import Callable

from dispatcher.config import Config
from dispatcher.metrics import Metrics
from dispatcher.rules.health import partition_breaches
from dispatcher.rules.partitions import EVENTS, Kind, Partition, Plan, ahead_days, partition_name
from dispatcher.store.engine import EngineStore
from dispatcher.store.operations import Presence
from dispatcher.store.partitions import Listing, Outcome, PartitionStore

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


Said = tuple[int, str]  # a log level and the message


def _failed(outcome: Outcome) -> Said:
    """A busy table is routine on a busy region (INFO); a refusal is not (WARNING)."""
    return (logging.INFO if outcome.retry else logging.WARNING, f"{outcome.detail}; tried again next round")


class Upkeep:
    def __init__(self, config: Config, store: EngineStore, metrics: Metrics, presence: Presence | None = None,
                 owner: str = "", partitions: PartitionStore | None = None) -> None:
        self._config = config
        self._store = store
        self._partitions = partitions or PartitionStore(store.connection)
        self._partition_policy = config.partition_policy()
        self._said: dict[str, Said] = {}  # what the partition upkeep last logged about each partition or table
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
        self._keep_partitions()  # last: a refusal raised here leaves the round's other work done

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

    def _keep_partitions(self) -> None:
        """Issue 25 (docs/operations.md, "Partition maintenance"): create the day partitions ahead, drop
        whole those the policy lets go, report those that wait, publish the gauges.  A table whose lock
        was busy gets no more DDL this round: each try may hold its producers up to the lock timeout."""
        listing = self._partitions.listing()
        found = [self._probed(p, listing) for p in listing.partitions]
        plan = self._partition_policy.plan(listing.now, found, listing.legacy_until)
        busy: set[str] = set()
        said: dict[str, Said] = {}
        created = self._create_ahead(plan, busy, said)
        self._drop(plan, busy, said)
        for decision in plan.wait:
            name = decision.partition.name
            said[name] = (logging.WARNING, f"partition {name} waits: {decision.reason}")
        ahead = ahead_days(listing.now.astimezone(datetime.UTC).date(), [*found, *created])
        for problem in partition_breaches(ahead):
            said[problem.split(" ", 1)[0]] = (logging.WARNING, problem)
        self._log_changes(said)
        self._metrics.gauges([("webhook_partitions_ahead_days", min(ahead.values())),
                              ("webhook_partitions_waiting", len(plan.wait))])

    def _probed(self, partition: Partition, listing: Listing) -> Partition:
        """An events partition past retention, with whether a delivery row still refers to it (only those:
        the probe reads the BRIN index of every deliveries partition)."""
        if partition.table != EVENTS or not self._partition_policy.past_retention(partition, listing.now,
                                                                                listing.legacy_until):
            return partition
        return dataclasses.replace(partition, referenced=self._partitions.events_referenced(partition))

    def _create_ahead(self, plan: Plan, busy: set[str], said: dict[str, Said]) -> list[Partition]:
        created = []
        for table, day in plan.create:
            if table in busy:
                continue
            outcome = self._partitions.create(table, day, self._config.partitions.lock_timeout)
            name = partition_name(table, day)
            if outcome.done:
                log.info("partitions: created %s", name)
                created.append(Partition(table, name, Kind.DAY, day))
            else:
                said[name] = _failed(outcome)
                if outcome.retry:
                    busy.add(table)
        return created

    def _drop(self, plan: Plan, busy: set[str], said: dict[str, Said]) -> None:
        for decision in plan.drop:
            partition = decision.partition
            if partition.table in busy:
                continue
            outcome = self._partitions.drop(partition, self._config.partitions.lock_timeout)
            if outcome.done:
                log.info("retention: dropped %s: %s", partition.name, decision.reason)
            else:
                said[partition.name] = _failed(outcome)
                if outcome.retry:
                    busy.add(partition.table)

    def _log_changes(self, said: dict[str, Said]) -> None:
        """Each wait or failure once, when it begins or changes (a round every check_interval would
        repeat it thousands of times a day), and once when it is over."""
        for key, (level, message) in said.items():
            if self._said.get(key) != (level, message):
                log.log(level, "%s", message)
        for key in self._said.keys() - said.keys():
            log.info("partitions: over: %s", self._said[key][1])
        self._said = said

    def _prune(self) -> None:
        """Q2, for the rows the DEFAULT partitions caught (a day without a partition); day partitions
        go whole (``_keep_partitions``).  Dead and failed rows are kept ``retention.dead`` after they
        ended (they end at most ``retry.ceiling`` after creation, or, behind an open breaker, once a
        probe after it fails: up to ``breaker.open_for`` later), delivered rows and marked shadow rows
        ``retention.delivered``, attempt history ``retention.attempts``, events ``retention.events``
        once no delivery row refers to them; finished bulk replay jobs ``retention.dead``."""
        retention = self._config.retention
        ended_by = self._config.ended_by()
        deleted = (self._prune_until_short(lambda: self._store.prune_deliveries(
                       ("dead", "failed"), retention.dead + ended_by, retention.batch))
                   + self._prune_until_short(lambda: self._store.prune_deliveries(
                       ("delivered", "shadow"), retention.delivered, retention.batch))
                   + self._prune_until_short(lambda: self._store.prune_attempts(retention.attempts, retention.batch))
                   + self._prune_until_short(lambda: self._store.prune_events(retention.events, retention.batch)))
        if deleted:
            log.info("retention: pruned %d rows of the DEFAULT partitions", deleted)
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
