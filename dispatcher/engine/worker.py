"""One dispatcher worker process: claim, send, record -- cooperatively.

Runs inside a gevent-patched process (see ``worker_main``).  Greenlets:

* the claimer keeps claiming while the process has room, never waiting for a
  batch to finish; endpoints whose local lane is full are excluded from the
  claim, so a hanging endpoint holds at most a lane's worth of rows;
* one lane per endpoint runs at most ``per_endpoint_concurrency`` senders;
  a sender whose lane ran dry parks and is woken for the next lane (a
  greenlet costs more to make than to wake);
* the flusher writes finished attempts in batches (one statement per flush)
  and updates the breakers;
* upkeep (one process per region, by a lease row: ``dispatcher.engine.upkeep``) evaluates backlog alerts,
  publishes the breaker gauges, sweeps rows that expire while a breaker is
  open, and prunes finished rows and attempt history past their retention
  (docs/decisions.md, Q2; ``dispatcher.engine.upkeep``);
* breaker notices (``dispatcher.engine.notifier``) tell endpoint owners that a
  breaker opened or closed again, on a connection of their own: woken by this
  process's transitions, and every check_interval on the upkeep leader;
* the heartbeat proves to the supervisor that the hub is not stuck;
* the status heartbeat records this process in the database every
  ``workers.status_interval`` (``dispatcher status`` and ``check`` read it),
  on a connection of its own: a failure there never touches delivery.

The loop contains no SQL: every database call goes through ``store.engine``.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import gevent
import gevent.event
import gevent.hub
import gevent.lock

from dispatcher.config import Config
from dispatcher.engine.delivery import Attempt, DeliveryMaker
from dispatcher.engine.notifier import OwnerNotices
from dispatcher.engine.replayer import BulkReplayer
from dispatcher.linelog import LineLog
from dispatcher.metrics import Metrics
from dispatcher.rules.backoff import Backoff
from dispatcher.rules.breaker import BreakerBatch, BreakerPolicy, BreakerSignal, BreakerWrite, Signal
from dispatcher.rules.bulk_replay import BulkReplayPolicy
from dispatcher.rules.lane import LanePolicy, running_mean
from dispatcher.rules.wake import WakeWatch
from dispatcher.runtime.deadline import database_bound
from dispatcher.store import DatabaseUnavailable, QueryRejected, StoreError
from dispatcher.store.engine import EVERY_ID, ClaimedRow, ClaimWindow, EngineStore, ManagedConnection, SlotEntry
from dispatcher.store.notices import NoticeStore
from dispatcher.store.operations import Presence
from dispatcher.store.replays import ReplayJobStore
from dispatcher.tracing import Tracer, carrier_of

if TYPE_CHECKING:
    from dispatcher.engine.upkeep import Upkeep

log = logging.getLogger("dispatcher.worker")
attempt_log = LineLog("dispatcher.attempt")  # one line per delivery: the cheap path (dispatcher.linelog)

# The pause after a claim that found some due rows but fewer than it could
# take: short enough that a row committed under steady load is picked up within
# a few tens of ms, long enough that a trickle does not turn into a claim per row
# (each claim costs the database a walk over the endpoints with pending rows).
BUSY_POLL = 0.05

# The waits after a failed claim or result write, up to ``database.reconnect_max``:
# each wait is its nominal value shortened by a random draw of up to half.
CLAIM_BACKOFF = Backoff(base=0.1, jitter=0.5)
WRITE_BACKOFF = Backoff(base=0.05, jitter=0.5)

# How often the claimer reads the claim's window of ids again (docs/claim.md, "The claim's
# window"): a pending row outside the window it holds -- committed after midnight with
# yesterday's id, or a held row resumed in an old partition -- is claimed at most this much later.
CLAIM_WINDOW_REFRESH = 5.0


class WindowCache:
    """The claim's window of ids, read again once it is ``refresh`` seconds old by ``clock``.

    A read that fails leaves the claim unbounded (``EVERY_ID``: every partition is read,
    none is missed) until the next read."""

    def __init__(self, read: Callable[[], ClaimWindow], refresh: float = CLAIM_WINDOW_REFRESH,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._refresh, self._clock = read, refresh, clock
        self._window = EVERY_ID
        self._read_at: float | None = None

    def current(self) -> ClaimWindow:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._refresh:
            self._read_at = now
            try:
                self._window = self._read()
            except StoreError as exc:
                log.warning("claim window not read, claiming from every partition until the next read: %s", exc)
                self._window = EVERY_ID
        return self._window


@dataclass
class Lane:
    """One endpoint's lane in this process: the region-wide slots it holds, the rows queued
    for them, and its senders (docs/claim.md, "Holding a lane")."""

    started: float                # monotonic: when the first slot was taken (the lane's turn)
    renewed: float                # monotonic: the last claim that renewed the slots' lease
    queue: deque[tuple[ClaimedRow, float]] = field(default_factory=deque)
    active: int = 0
    grants: dict[int, int] = field(default_factory=dict)  # claim token -> slots held under it
    cooling: list[float] = field(default_factory=list)    # monotonic ends of timed-out slots' holds
    mean: float | None = None     # running mean of this endpoint's attempt time, seconds; None: none yet
    woke_at: float | None = None  # the mean with which the lane last woke the claimer for rows (_wake_if_low)
    asked: int = 0                # rows asked for by a claim still under way
    closing: bool = False         # no more rows: drain, then give the slots back
    timed: bool = False           # a timer will start senders when a resting slot is usable again

    @property
    def slots(self) -> int:
        return sum(self.grants.values())

    def usable(self, now: float) -> int:
        """Slots a sender may use now: a timed-out attempt's slot rests for its hold."""
        if self.cooling:
            self.cooling = [end for end in self.cooling if end > now]
        return self.slots - len(self.cooling)


class FailureWaits:
    """Waits out failures in a row by a back-off rule; the caller resets it after a success."""

    def __init__(self, rule: Backoff) -> None:
        self._rule, self._failures = rule, 0

    def wait(self, stop: gevent.event.Event) -> None:
        self._failures += 1
        stop.wait(self._rule.delay(self._failures, random.random()))

    def reset(self) -> None:
        self._failures = 0


def latest_entries(entries: list[SlotEntry]) -> list[SlotEntry]:
    """One entry per (endpoint, token), the last written: each names what the lane holds now.
    A resting slot's hold rides only on an entry's last write (the lane gives it back once)."""
    latest: dict[tuple[int, int], SlotEntry] = {}
    for entry in entries:
        latest[(entry.endpoint_id, entry.token)] = entry
    return list(latest.values())


class Worker:
    def __init__(self, config: Config, dsn: str, owner: str, heartbeat_path: str | None = None,
                 maker: DeliveryMaker | None = None, tracer: Tracer | None = None) -> None:
        self.config = config
        # Spans (docs/operations.md, "Tracing"); off: Tracer.off(), which does nothing.
        self._tracer = tracer if tracer is not None else Tracer.from_config(config.tracing, "dispatcher-worker")
        self.owner = owner
        self._heartbeat_path = heartbeat_path
        def connection(purpose: str) -> ManagedConnection:
            database = config.database
            return ManagedConnection(dsn, f"dispatcher {purpose} {owner}", database.connect_timeout,
                                     database.prepared_statements, bound=database_bound,
                                     statement_deadline=database.statement_deadline)

        self._claims = EngineStore(connection("claim"))
        # One statement at a time on the claim connection: the claimer claims on it, and senders,
        # the flusher and shutdown hand rows back on it (psycopg2 refuses a second query while
        # one is under way, and the rows would then wait for their lease to lapse).
        self._claims_lock = gevent.lock.Semaphore()
        self._window = WindowCache(self._claims.claim_window)
        self._results = EngineStore(connection("record"))
        upkeep = connection("upkeep")
        self._upkeep = EngineStore(upkeep)
        self._leader_presence = Presence(upkeep, owner, config.region)
        self._presence = Presence(connection("status"), owner, config.region)
        self._maker = maker or DeliveryMaker.from_config(config, self._tracer)
        self._metrics = Metrics(config.statsd, config.region)
        # Its own connection, opened on first use (by the leader, or after a transition seen here).
        self._notices = OwnerNotices(config, NoticeStore(connection("notify")))
        self._notice_due = gevent.event.Event()
        # Bulk replay jobs, on the upkeep leader, on a connection of their own (opened on first use).
        self._replayer = BulkReplayer(ReplayJobStore(connection("replay")), BulkReplayPolicy())
        self._breaker = config.breaker.policy()
        self._lanes: dict[int, Lane] = {}
        workers = config.workers
        # The room a claim keeps for its walk, however much its lanes' refills could take: the
        # claimer claims once a quarter batch of room is free.  A refill that took all the room
        # left its claim no walk, and the claimer then walked at once in a claim of its own: two
        # statements, each planned, for one lane's rows.
        self._walk_room = max(1, min(workers.claim_batch, workers.max_in_flight) // 4)
        # A refill is bounded by the lane's budget and horizon, not by the walk's batch: one claim
        # may bring a hot lane hundreds of rows (docs/claim.md, "Queueing ahead").
        self._lane_policy = LanePolicy(workers.lease, config.http.timeout, workers.lane_horizon, workers.lane_turn,
                                       max(1, workers.max_in_flight - self._walk_room), workers.lane_hold)
        # This process's share of an endpoint's slots while it is slot-bound with few lanes: a hot
        # endpoint's lane is then served by every process of the host at once, not by whichever
        # claimed it first.  Otherwise a visit takes the whole room, as a visit costs the database
        # about as much for one row as for four.
        self._share = -(-workers.per_endpoint_concurrency // workers.processes)
        self._held = 0
        self._slots = 0   # the slots all lanes hold (the sum of their grants)
        self._finished: list[Attempt] = []
        self._slot_entries: list[SlotEntry] = []
        # A lane let go at the end of its turn still had rows due: once the flush has given its
        # slots back, the claimer looks again at once instead of after an idle poll_interval.
        self._turned = False
        self._wake = gevent.event.Event()
        self._room = gevent.event.Event()
        self._flush_now = gevent.event.Event()
        self._stopping = gevent.event.Event()
        self._cursor = 0
        self._wake_watch = WakeWatch()  # what an idle worker has seen of new rows (rules.wake)
        self._upkeep_runner: Upkeep | None = None
        # Senders with no lane to serve, each waiting for the next (a stack of them: the most
        # recently parked, whose memory is warmest, goes first).
        self._parked: list[gevent.hub.Waiter[tuple[int, Lane] | None]] = []

    # -- lifecycle ---------------------------------------------------------

    def run(self) -> None:
        """Serve until ``stop`` is called; then drain within the grace period."""
        log.info("worker %s started (client=%s) event=worker_started", self.owner, self.config.http.client)
        background = [gevent.spawn(self._flush_loop), gevent.spawn(self._upkeep_loop),
                      gevent.spawn(self._notice_loop), gevent.spawn(self._replay_loop)]
        if self._heartbeat_path:
            background.append(gevent.spawn(self._heartbeat_loop))
        status = gevent.spawn(self._status_loop)
        claimer = gevent.spawn(self._claim_loop)
        self._stopping.wait()
        claimer.join()
        self._hand_back_queued()
        self._wait_for_senders(self.config.workers.graceful_timeout)
        self._end_parked()
        self._flush_now.set()
        gevent.killall(background[1:], block=True, timeout=2)
        background[0].join(timeout=self.config.workers.graceful_timeout)
        self._maker.close()
        self._tracer.shutdown()  # exports what is queued, bounded by the exporter's timeout
        self._leave(status)
        log.info("worker %s stopped", self.owner)

    def stop(self) -> None:
        self._stopping.set()

    # -- claiming ----------------------------------------------------------

    def _claim_loop(self) -> None:
        backoff = FailureWaits(replace(CLAIM_BACKOFF, cap=self.config.database.reconnect_max))
        workers = self.config.workers
        while not self._stopping.is_set():
            self._wake.clear()
            refill, want = self._asks()
            if not refill and want < self._walk_room and self._held:
                self._room.clear()
                self._room.wait(workers.poll_interval)
                continue
            started_ns = time.time_ns()
            try:
                with self._claims_lock:
                    share = self._walk_share()
                    rows = self._claims.claim(self.owner, max(want, 0), workers.per_endpoint_concurrency,
                                              self._busy_endpoints(share), self._cursor, workers.lease,
                                              self.config.secrets.rotation_grace, refill, share,
                                              window=self._window.current())
            except StoreError as exc:
                log.warning("claim failed, backing off: %s", exc)
                self._settle_refills(refill, [], answered=False)
                backoff.wait(self._stopping)
                continue
            backoff.reset()
            if rows and self._tracer.enabled:
                self._tracer.batch_span("dispatcher.claim", started_ns,
                                        # parsed only if the claim's span is kept (links)
                                        (carrier_of(row.delivery_trace) or carrier_of(row.event_trace)
                                         for row in rows),
                                        {"dispatcher.rows": len(rows), "dispatcher.owner": self.owner})
            self._accept(rows)
            self._settle_refills(refill, rows, answered=True)
            pause = self._pause_after(rows, want)
            if pause is not None:
                self._wait_for_rows(pause)

    def _wait_for_rows(self, pause: float) -> None:
        """Wait ``pause`` or until woken; meanwhile read every ``workers.wake_interval`` whether
        new rows may have come (``rules.wake``), and end the wait if so.  An idle worker would
        otherwise see a burst up to a poll_interval late; a claim at every tick instead would
        cost the database a planned claim where this costs a read of a sequence."""
        interval = self.config.workers.wake_interval
        ends = time.monotonic() + pause
        while (left := ends - time.monotonic()) > interval:
            if self._wake.wait(interval) or self._stopping.is_set() or self._new_rows():
                return
        self._wake.wait(max(left, 0.0))

    def _new_rows(self) -> bool:
        """Whether a claim now may find rows its last one could not see (``WakeWatch``).  A
        failed read says no: the claim after the pause meets the database's trouble itself."""
        try:
            with self._claims_lock:
                mark = self._claims.wake_mark()
        except StoreError:
            return False
        self._wake_watch, claim = self._wake_watch.after(mark)
        return claim

    def _asks(self) -> tuple[list[tuple[int, int, bool]], int]:
        """The next claim's refills, and the rows its walk asks for: what the process may still
        hold, the refills first, less ``_walk_room`` kept for the walk."""
        workers = self.config.workers
        room = workers.max_in_flight - self._held
        refill = self._refills(room - self._walk_room)
        return refill, min(workers.claim_batch, room - sum(asked for _, asked, _ in refill))

    def _pause_after(self, rows: list[ClaimedRow], want: int) -> float | None:
        """How long the claimer waits after a claim whose walk asked ``want`` rows and that took
        ``rows``; None: claim again at once (the walk took all it asked).

        Idle (the walk found nothing due): poll_interval.  Busy (it found rows but fewer than it
        could take): rows keep arriving, so look again soon, or pick-up latency under steady load
        would be poll_interval / 2 on average, not a few ms.  Only the walk's rows count: a lane's
        refilled rows say nothing of other endpoints, and a lane running low wakes the claimer at
        once (_wake), so a hot lane alone made a claim every BUSY_POLL that walked for nothing."""
        walked = sum(1 for row in rows if row.grants_slot)
        if walked >= want:
            return None
        return self.config.workers.poll_interval if not walked else min(self.config.workers.poll_interval, BUSY_POLL)

    def _refills(self, room: int) -> list[tuple[int, int, bool]]:
        """(endpoint, rows wanted, renew) for each lane that needs more rows or a renewed lease;
        marks what is asked, within ``room``.  An empty lane this claim asks nothing for goes back."""
        now = time.monotonic()
        refill: list[tuple[int, int, bool]] = []
        roomy = self._lane_budget(1) >= 2  # some lane can queue ahead (LanePolicy.budget, refill)
        # The emptiest lanes first: when room is short, it goes where senders would wait.
        for endpoint_id, lane in sorted(self._lanes.items(), key=lambda item: len(item[1].queue)):
            if lane.asked or lane.closing or not lane.grants:
                continue
            want = min(room, self._refill(lane, now, self._claim_mean(lane))) if roomy else 0
            lane.woke_at = None
            renew = roomy and self._lane_policy.renewal_due(now - lane.renewed)
            if want > 0 or renew:
                room -= max(want, 0)
                lane.asked = max(want, 0)
                refill.append((endpoint_id, lane.asked, renew))
            elif not lane.queue and not lane.active and not self._keeps(lane):
                # _settle kept it for this claim, which asks it nothing: its turn ended meanwhile
                # (a slow claim), or other lanes took its budget.  Nothing else would look at it
                # again before its lease's renewal, so its slots go back now.
                self._give_back(endpoint_id, lane)
        return refill

    def _settle_refills(self, refill: list[tuple[int, int, bool]], rows: list[ClaimedRow], answered: bool) -> None:
        """After a claim: an answered renewal renewed its lane's slots, and a lane whose refill
        found no due rows has run dry (it gives its slots back once its senders finish)."""
        if not refill:
            return
        now = time.monotonic()
        got = {row.endpoint_id for row in rows if not row.grants_slot}
        for endpoint_id, asked, renew in refill:
            lane = self._lanes.get(endpoint_id)
            if lane is None:
                continue
            lane.asked = 0
            if answered:
                lane.renewed = now if renew else lane.renewed
                lane.closing = lane.closing or bool(asked and endpoint_id not in got)
            self._settle(endpoint_id, lane)

    def _accept(self, rows: list[ClaimedRow]) -> None:
        if not rows:
            return
        claimed_at = time.monotonic()
        walked = [row.endpoint_id for row in rows if row.grants_slot]
        if walked:
            wrapped = [endpoint_id for endpoint_id in walked if endpoint_id <= self._cursor]
            self._cursor = max(wrapped) if wrapped else max(walked)
        strays: list[tuple[int, int]] = []
        for row in rows:
            lane = self._lanes.get(row.endpoint_id)
            if lane is None:
                if not row.grants_slot:  # its lane gave its slots back while the claim ran
                    strays.append((row.id, row.claim_token))
                    continue
                lane = self._lanes[row.endpoint_id] = Lane(started=claimed_at, renewed=claimed_at)
            if row.grants_slot:
                lane.grants[row.claim_token] = lane.grants.get(row.claim_token, 0) + 1
                self._slots += 1
            lane.queue.append((row, claimed_at))
            self._held += 1
        for endpoint_id in {row.endpoint_id for row in rows}:
            lane = self._lanes.get(endpoint_id)
            if lane is not None:
                self._start_senders(endpoint_id, lane)
        self._release(strays)

    # -- sending -----------------------------------------------------------

    def _start_senders(self, endpoint_id: int, lane: Lane) -> None:
        if self._lanes.get(endpoint_id) is not lane:
            return  # a timer for a lane that has since given its slots back
        now = time.monotonic()
        usable = lane.usable(now)
        while lane.active < usable and lane.queue:
            lane.active += 1
            if self._parked:
                # Waking a parked sender costs a fraction of a new greenlet (docs/benchmarks.md).
                gevent.get_hub().loop.run_callback(self._parked.pop().switch, (endpoint_id, lane))
            else:
                gevent.spawn(self._sender, endpoint_id, lane)
        if lane.queue and lane.cooling and not lane.timed:
            # Rows wait for a resting slot: look again when the first rest ends (a little
            # after: the loop's clock runs behind time.monotonic()).
            lane.timed = True
            gevent.spawn_later(min(lane.cooling) - now + 0.005, self._rested, endpoint_id, lane)

    def _rested(self, endpoint_id: int, lane: Lane) -> None:
        lane.timed = False
        self._start_senders(endpoint_id, lane)

    def _sender(self, endpoint_id: int, lane: Lane) -> None:
        """Serve one lane, then park until ``_start_senders`` hands over another (or the process stops)."""
        job: tuple[int, Lane] | None = (endpoint_id, lane)
        while job is not None:
            self._send_lane(*job)
            job = self._park()

    def _send_lane(self, endpoint_id: int, lane: Lane) -> None:
        """Send this lane's rows one after another, each as soon as the one before is answered,
        while the lane has rows and a usable slot for this sender."""
        try:
            while lane.queue and not self._stopping.is_set():
                now = time.monotonic()
                if lane.active > lane.usable(now):
                    break  # a timed-out attempt's slot rests: one sender fewer for now
                row, claimed_at = lane.queue.popleft()
                if not self._lane_policy.sendable(now - claimed_at, now - lane.renewed):
                    # Its lease (or its lane's) would lapse mid-attempt: another worker may take it then.
                    self._held -= 1
                    self._room.set()
                    self._release([(row.id, row.claim_token)])
                    continue
                attempt = self._maker.attempt(row, claimed_at)
                lane.mean = running_mean(lane.mean, attempt.record.duration_ms / 1000.0)
                if attempt.record.hold > 0:
                    lane.cooling.append(time.monotonic() + attempt.record.hold)
                self._finish(attempt)
                if attempt.breaker is BreakerSignal.FAILURE:
                    # The breaker learns of it at the next flush: until then the lane sends no
                    # more of its queue into what may be a failing endpoint (each would use an attempt).
                    self._hand_back_lane(endpoint_id)
                    break
                self._wake_if_low(lane)
        finally:
            lane.active -= 1
            if lane.queue and not self._stopping.is_set():
                self._start_senders(endpoint_id, lane)  # or a timer, when the rows wait for a resting slot
            self._settle(endpoint_id, lane)

    def _busy_endpoints(self, share: int) -> list[int]:
        """Lanes the walk passes by: those that may take no more slots (LanePolicy.takes_more; a
        refilled lane is passed by too, by the store)."""
        now = time.monotonic()
        limit = self.config.workers.per_endpoint_concurrency
        # A lane that has run dry (closing) takes no slots beyond its share: it is giving them back.
        return [endpoint_id for endpoint_id, lane in self._lanes.items()
                if not self._lane_policy.takes_more(lane.slots, share, limit, now - lane.started)
                or (lane.closing and lane.slots >= share)]

    def _walk_share(self) -> int:
        """Slots one walk visit may take: the process's share while a lane of a whole endpoint's
        slots could still queue ahead."""
        limit = self.config.workers.per_endpoint_concurrency
        workers = self.config.workers
        roomy = self._lane_policy.budget(workers.max_in_flight, limit, self._slots + limit) >= 2 * limit
        return self._share if roomy else limit

    def _lane_budget(self, slots: int) -> int:
        """Rows a lane of ``slots`` may hold (LanePolicy.budget)."""
        return self._lane_policy.budget(self.config.workers.max_in_flight, slots, self._slots)

    def _wants_rows(self, lane: Lane) -> bool:
        """The lane, open and holding slots, would ask the next claim for rows (LanePolicy.refill)."""
        if lane.closing or not lane.grants:
            return False
        return self._refill(lane, time.monotonic(), lane.mean) > 0

    def _wake_if_low(self, lane: Lane) -> None:
        if not lane.asked and self._wants_rows(lane):
            lane.woke_at = lane.mean
            self._wake.set()

    def _refill(self, lane: Lane, now: float, mean: float | None) -> int:
        """Rows the lane would ask a claim for (LanePolicy.refill) were its attempts to take ``mean``."""
        return self._lane_policy.refill(lane.slots, len(lane.queue), mean, now - lane.started,
                                        self._lane_budget(lane.slots))

    @staticmethod
    def _claim_mean(lane: Lane) -> float | None:
        """The mean a claim sizes the lane's refill by: the lower of its mean now and the one it woke
        the claimer with.  An attempt stalled by the process's own work (a claim's rows being read,
        a flush) moves the mean several times over in the few ms before the claimer runs; sized by
        that mean, the claim asked the lane for nothing, walked for nothing, and the lane ran dry
        before the next wake (docs/claim.md, "Queueing ahead")."""
        if lane.woke_at is None or lane.mean is None:
            return lane.mean
        return min(lane.mean, lane.woke_at)

    def _settle(self, endpoint_id: int, lane: Lane) -> None:
        """A lane whose queue is empty, with no rows asked for, keeps its slots only while the
        very next claim can bring it rows (lanes held, the process has room, the lane is neither
        closing nor past its turn); otherwise every slot no sender uses goes back at once, and
        the lane with its last one: a slot is never kept idle."""
        if lane.queue or lane.asked or self._lanes.get(endpoint_id) is not lane:
            return
        if self._keeps(lane):
            if not lane.active:
                self._wake.set()
            return
        if lane.active:
            self._give_back_spare(endpoint_id, lane)
        else:
            self._give_back(endpoint_id, lane)

    def _keeps(self, lane: Lane) -> bool:
        """An empty lane keeps its slots only while the next claim can bring it rows."""
        return (not self._stopping.is_set() and self._held < self.config.workers.max_in_flight
                and self._wants_rows(lane))

    def _give_back_spare(self, endpoint_id: int, lane: Lane) -> None:
        """The slots no sender uses go back; resting ones stay with the lane until it gives all
        back, so a timed-out slot's hold is written once."""
        spare = lane.slots - lane.active - len(lane.cooling)
        for token in list(lane.grants):
            if spare <= 0:
                return
            given = min(spare, lane.grants[token])
            spare -= given
            self._slots -= given
            lane.grants[token] -= given
            self._slot_entries.append(SlotEntry(endpoint_id, token, lane.grants[token]))
            if not lane.grants[token]:
                del lane.grants[token]

    def _give_back(self, endpoint_id: int, lane: Lane) -> None:
        """Every slot of the lane goes back with the next flush (within ``workers.flush_interval``:
        a flush of its own per lane would cost a statement per lane); a resting one after its hold."""
        del self._lanes[endpoint_id]
        self._slots -= lane.slots
        now = time.monotonic()
        if not lane.closing and not self._stopping.is_set() and now - lane.started >= self._lane_policy.turn:
            self._turned = True
        resting = sorted(end - now for end in lane.cooling if end > now)
        for token, count in lane.grants.items():
            rest, resting = resting[:count], resting[count:]
            self._slot_entries.append(SlotEntry(endpoint_id, token, 0, len(rest), rest[-1] if rest else 0.0))

    def _park(self) -> tuple[int, Lane] | None:
        """The next lane to serve, or None: the sender ends.  At most as many senders park as
        were ever busy at once, itself bounded by ``workers.max_in_flight``."""
        if self._stopping.is_set():
            return None
        waiter: gevent.hub.Waiter[tuple[int, Lane] | None] = gevent.hub.Waiter()
        self._parked.append(waiter)
        return waiter.get()

    def _end_parked(self) -> None:
        while self._parked:
            gevent.get_hub().loop.run_callback(self._parked.pop().switch, None)

    def _finish(self, attempt: Attempt) -> None:
        self._finished.append(attempt)
        self._held -= 1
        self._room.set()
        if len(self._finished) >= self.config.workers.claim_batch:
            self._flush_now.set()
        record = attempt.record
        attempt_log.info(f"attempt event_id={attempt.event_id} endpoint_id={record.endpoint_id} "
                         f"attempt={record.attempt} status={record.status} result={record.result} "
                         f"duration_ms={record.duration_ms}")

    # -- recording ---------------------------------------------------------

    def _flush_loop(self) -> None:
        backoff = FailureWaits(replace(WRITE_BACKOFF, cap=self.config.database.reconnect_max))
        interval = self.config.workers.flush_interval
        while True:
            self._flush_now.wait(interval)
            self._flush_now.clear()
            drained = self._stopping.is_set() and self._held == 0 and not self._lanes
            if self._finished or self._slot_entries:
                batch, self._finished = self._finished, []
                entries, self._slot_entries = latest_entries(self._slot_entries), []
                turned, self._turned = self._turned, False
                if not self._write(batch, entries):
                    self._finished = batch + self._finished
                    self._slot_entries = entries + self._slot_entries
                    self._turned = self._turned or turned
                    backoff.wait(gevent.event.Event())
                    continue
                backoff.reset()
                if turned:
                    self._wake.set()  # the turned lane's slots are back in the region: claim them round
            if drained and not self._finished and not self._slot_entries:
                return

    def _write(self, batch: list[Attempt], entries: list[SlotEntry]) -> bool:
        """Write results and the lane slots given back; False: try the same again later."""
        started_ns = time.time_ns()
        try:
            written = self._results.record([a.record for a in batch], entries)
        except DatabaseUnavailable as exc:
            log.warning("result write failed, will retry %d results: %s", len(batch), exc)
            return False
        except QueryRejected as exc:
            # One bad result must not block the others, nor stop this loop:
            # halve the batch until the refused result stands alone.
            log.error("the database refused a batch of %d results (%s); writing it in parts", len(batch), exc)
            if len(batch) <= 1:
                return self._write_bare(batch, entries)
            half = len(batch) // 2
            return self._write(batch[:half], entries) and self._write(batch[half:], [])
        stale = len(batch) - len(written)
        if stale:
            log.warning("%d stale results rejected by the claim-token fence (lease lapsed)", stale)
        kept = [a for a in batch if a.record.id in written]
        if batch and self._tracer.enabled:
            self._tracer.batch_span("dispatcher.record", started_ns,
                                    ({"traceparent": a.record.traceparent} if a.record.traceparent else None
                                     for a in batch),
                                    {"dispatcher.rows": len(batch), "dispatcher.stale": stale})
        self._metrics.attempts((a.record.result, a.latency, a.commit_to_2xx) for a in kept)
        self._update_breakers(kept)
        return True

    def _write_bare(self, batch: list[Attempt], entries: list[SlotEntry]) -> bool:
        """A result the database refuses: store it without its free text, or
        give up on it -- its lease then lapses and the row is sent again (and
        the slots named with it lapse with their lease too)."""
        bare = [attempt.record._replace(error="the attempt's error text could not be stored", excerpt=None)
                for attempt in batch]
        try:
            self._results.record(bare, entries)
        except DatabaseUnavailable:
            return False
        except QueryRejected as exc:
            log.error("result of %s cannot be stored (%s); sent again after its lease",
                      f"delivery {batch[0].record.id}" if batch else "a lane's slots", exc)
        return True

    def _update_breakers(self, attempts: list[Attempt]) -> None:
        batch = BreakerBatch(self._breaker, (Signal(a.record.endpoint_id, a.breaker, a.record.error)
                                             for a in attempts))
        if not batch.endpoint_ids:
            return
        try:
            touched = self._results.touch_closed_breakers(batch.closed_writes())
            rest = [endpoint_id for endpoint_id in batch.endpoint_ids if endpoint_id not in touched]
            writes = self._results.update_breakers(rest, batch) if rest else []
        except StoreError as exc:
            log.warning("breaker update failed (counts from this batch are lost): %s", exc)
            return
        for write in writes:
            self._announce(write)
            if write.breaker.state == "open":
                self._hand_back_lane(write.endpoint_id)

    def _hand_back_lane(self, endpoint_id: int) -> None:
        """The endpoint's breaker is open (or the process stops): rows queued here must not be
        sent now (they would consume attempts), so they go back to the outbox, and the lane's
        slots follow once its senders finish."""
        lane = self._lanes.get(endpoint_id)
        if lane is None:
            return
        lane.closing = True
        unsent = [(row.id, row.claim_token) for row, _ in lane.queue]
        lane.queue.clear()
        self._held -= len(unsent)
        self._room.set()
        self._release(unsent)
        self._settle(endpoint_id, lane)

    def _announce(self, write: BreakerWrite) -> None:
        transition = BreakerPolicy.transitions(write.previous, write.breaker)
        if transition is None:
            return
        log.warning("breaker %s endpoint_id=%d failures=%d open_until=%s", transition, write.endpoint_id,
                    write.breaker.consecutive_failures, write.breaker.open_until)
        self._metrics.breaker(write.endpoint_id, write.breaker.state)
        if transition in ("opened", "closed"):
            self._notice_due.set()  # docs/decisions.md, Q3: the owner hears of it (dispatcher.engine.notifier)

    # -- shutdown ----------------------------------------------------------

    def _hand_back_queued(self) -> None:
        """TERM: rows claimed but not yet started go back at once, not at lease end."""
        for endpoint_id in list(self._lanes):
            self._hand_back_lane(endpoint_id)

    def _wait_for_senders(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        while self._held > 0 and time.monotonic() < deadline:
            self._room.clear()
            self._room.wait(0.05)
        if self._held > 0:
            log.warning("grace period over with %d sends in flight; their rows are released event=grace_period_over",
                        self._held)
            self._release([(row.id, row.claim_token) for row in self._maker.in_flight()])
        for endpoint_id, lane in list(self._lanes.items()):
            self._give_back(endpoint_id, lane)

    def _release(self, claims: list[tuple[int, int]]) -> None:
        if not claims:
            return
        try:
            with self._claims_lock:
                released = self._claims.release(claims)
            log.info("handed back %d unsent claimed rows", released)
        except StoreError as exc:
            log.warning("could not hand back %d rows, their lease will lapse: %s", len(claims), exc)

    # -- upkeep and heartbeat ----------------------------------------------

    def _upkeep_loop(self) -> None:
        from dispatcher.engine.upkeep import Upkeep

        upkeep = Upkeep(self.config, self._upkeep, self._metrics, self._leader_presence, owner=self.owner)
        self._upkeep_runner = upkeep
        while not self._stopping.wait(self.config.alerts.check_interval):
            try:
                upkeep.run_once()
            except DatabaseUnavailable as exc:
                upkeep.lost_connection()
                log.warning("upkeep skipped: %s", exc)
            except StoreError as exc:  # refused, or a table missing: the loop must outlive it
                log.error("upkeep step refused by the database, retried next round: %s", exc)

    def _notice_loop(self) -> None:
        """Breaker notices (``dispatcher.engine.notifier``), off the delivery path: a round
        when a breaker of this process opened or closed, and every check_interval
        on the upkeep leader (retries, and what a process that died did not send).
        Nothing here may end the loop or reach delivery."""
        interval = self.config.alerts.check_interval
        while True:
            woken = self._notice_due.wait(interval)
            self._notice_due.clear()
            leader = self._upkeep_runner is not None and self._upkeep_runner.is_leader
            if not (woken or leader):
                continue
            try:
                self._notices.run_once(prune=leader)
            except Exception as exc:  # a StoreError, or anything else: logged, tried again next round
                log.warning("breaker notices skipped this round: %s", exc)

    def _replay_loop(self) -> None:
        """Bulk replay jobs (``dispatcher.engine.replayer``) on the upkeep leader: a batch, then
        the policy's pause while a job runs, else a look every check_interval.  Off the delivery
        path: nothing here may end the loop."""
        idle = self.config.alerts.check_interval
        while True:
            leader = self._upkeep_runner is not None and self._upkeep_runner.is_leader
            busy = False
            if leader:
                try:
                    busy = self._replayer.run_once()
                except Exception as exc:  # a StoreError, or anything else: logged, tried again later
                    log.warning("bulk replay batch skipped: %s", exc)
            if self._stopping.wait(self._replayer.policy.pause if busy else idle):
                return

    def _heartbeat_loop(self) -> None:
        assert self._heartbeat_path is not None
        parent = os.getppid()
        while not self._stopping.wait(self.config.workers.heartbeat_interval):
            if os.getppid() != parent:
                # The supervisor died without stopping us: nobody would
                # release our leases or replace us, so drain and leave.
                log.error("supervisor %d is gone; worker %s shuts down", parent, self.owner)
                self.stop()
                return
            try:
                os.utime(self._heartbeat_path)
            except OSError:
                pass  # the supervisor removed it: it is shutting us down anyway


    def _status_loop(self) -> None:
        """This process's row in ``dispatcher_processes``: one upsert per
        ``workers.status_interval``.  Off the hot path, on its own connection;
        any failure is logged once (and its end once) and never reaches delivery."""
        host, pid, started = socket.gethostname(), os.getpid(), time.time()
        failing = False
        while True:
            try:
                self._presence.beat(host, pid, started, self._held)
                if failing:
                    log.info("status heartbeat recorded again")
                failing = False
            except Exception as exc:  # a StoreError, or anything else: this loop must not end
                if not failing:
                    log.warning("status heartbeat not recorded (status/check will see this process as silent): %s",
                                exc)
                failing = True
            if self._stopping.wait(self.config.workers.status_interval):
                return

    def _leave(self, status: gevent.Greenlet) -> None:
        """Stopped gracefully: remove our row, so status lists live processes only."""
        status.join(timeout=2)
        status.kill(block=True, timeout=1)
        try:
            self._presence.leave()
        except Exception as exc:  # best effort: a silent row ages out of the live list anyway
            log.info("status row not removed: %s", exc)
