"""How often the claimer claims while a hot lane drains (docs/claim.md, "Queueing ahead" and "The worker keeps
claiming as capacity frees up").

A hot endpoint's lane refills from the claim.  Two rules kept those claims small and twice as many as they
needed to be (the fast `hot` case: 400 claims of about 100 rows for 40,000 deliveries):

* a refill was capped at the walk's batch (``workers.claim_batch``), not by the lane's budget and horizon;
* the claimer paused after a claim by all the rows it took, so a claim whose walk found nothing but whose
  refills brought rows was taken for busy, and the claimer walked again 50 ms later, for nothing; and a
  refill that took all the process's room left its claim no walk, so the claimer walked at once in a claim
  of its own.

And a lane that woke the claimer for rows could be asked for none: its refill was sized by a mean that one
attempt, stalled by the process's own work, had moved in the meantime (a quarter of the fast case's claims).

The worker's bookkeeping is tested in memory, on a worker that never connects."""

from __future__ import annotations

import time
from typing import Any

from dispatcher.engine.worker import BUSY_POLL, Lane, Worker
from dispatcher.rules.lane import running_mean
from dispatcher.store.engine import ClaimedRow
from tests.unit.unconnected import unconnected_worker


def _worker(**workers: Any) -> Worker:
    return unconnected_worker(processes=2, poll_interval="500ms", **workers)


def _hot_lane(worker: Worker, endpoint_id: int, slots: int, mean: float) -> Lane:
    """A lane holding ``slots`` whose queue has run dry, answering in ``mean`` seconds."""
    now = time.monotonic()
    lane = Lane(started=now - 0.5, renewed=now - 0.5, grants={7: slots}, mean=mean, active=slots)
    worker._lanes[endpoint_id] = lane
    worker._slots += slots
    worker._held += slots  # its senders' rows
    return lane


def _row(row_id: int, grants_slot: bool) -> ClaimedRow:
    return ClaimedRow(id=row_id, claim_token=7, grants_slot=grants_slot, endpoint_id=1, event_id=f"e{row_id}",
                      attempt=1, mode="live", age=0.0, db_now=0.0, is_probe=False, event_type="job.created",
                      sequence=row_id, occurred_at=None, payload="{}", url="http://127.0.0.1:9/", active=True,
                      secret="s", previous_secret=None, workspace_id="w")


def test_a_hot_lane_refills_past_the_walks_batch() -> None:
    worker = _worker(claim_batch=200, max_in_flight=512)
    _hot_lane(worker, 1, slots=2, mean=0.001)  # 0.25 s of work is 500 rows
    refill, _ = worker._asks()
    assert len(refill) == 1 and refill[0][0] == 1
    assert refill[0][1] > 200, "a refill is bounded by the lane's budget and horizon, not the walk's batch"


def test_a_refill_leaves_the_claim_room_to_walk() -> None:
    worker = _worker(claim_batch=200, max_in_flight=512)
    _hot_lane(worker, 1, slots=2, mean=0.001)
    worker._held += 300  # rows of other lanes, queued and in flight
    refill, want = worker._asks()
    asked = sum(rows for _, rows, _ in refill)
    assert want >= 50, "the claim keeps a quarter batch of the room for its walk"
    assert asked + want == 512 - worker._held, "and the refill takes the rest"


def test_a_lane_asks_no_more_than_the_process_may_hold() -> None:
    worker = _worker(claim_batch=200, max_in_flight=100)
    _hot_lane(worker, 1, slots=2, mean=0.001)
    refill, want = worker._asks()
    assert 0 < sum(rows for _, rows, _ in refill) <= 100 - 25 - worker._held
    assert want >= 25


def test_a_claim_whose_walk_found_nothing_waits_the_idle_poll_whatever_its_refills_brought() -> None:
    worker = _worker()
    refilled = [_row(i, grants_slot=False) for i in range(150)]
    assert worker._pause_after(refilled, want=50) == 0.5


def test_a_claim_whose_walk_found_some_rows_looks_again_soon() -> None:
    worker = _worker()
    rows = [_row(1, grants_slot=True), *(_row(i, grants_slot=False) for i in range(2, 200))]
    assert worker._pause_after(rows, want=50) == BUSY_POLL


def test_a_claim_whose_walk_took_all_it_asked_claims_again_at_once() -> None:
    worker = _worker()
    assert worker._pause_after([_row(i, grants_slot=True) for i in range(50)], want=50) is None
    assert worker._pause_after([], want=0) is None, "a claim that did not walk (no room) does not wait for it"


def _queued_lane(worker: Worker, queued: int, mean: float) -> Lane:
    """A hot lane (2 slots, both sending) with ``queued`` rows waiting, answering in ``mean`` seconds."""
    lane = _hot_lane(worker, 1, slots=2, mean=mean)
    now = time.monotonic()
    lane.queue.extend((_row(i, grants_slot=False), now) for i in range(queued))
    worker._held += queued
    return lane


def test_a_lane_that_woke_the_claimer_for_rows_gets_them_though_an_attempt_stalled_since() -> None:
    # Seen in the fast `hot` case: a lane at 1 ms an attempt, 200 rows queued of its 462-row depth, woke the
    # claimer; before the claimer ran, one attempt that waited ~24 ms on the process's own work (a claim's rows
    # being read) took the mean to 5.6 ms.  Sized by that mean the lane wanted nothing: the claim walked for
    # nothing (a planned claim) and the lane ran dry before the next wake.
    worker = _worker(claim_batch=200, max_in_flight=512)
    lane = _queued_lane(worker, 200, mean=0.001)
    worker._wake_if_low(lane)
    assert worker._wake.is_set(), "below half its depth, the lane wakes the claimer"
    lane.mean = running_mean(lane.mean, 0.024)
    assert not worker._wants_rows(lane), "the stalled attempt alone would size the lane's depth below its queue"
    refill, _ = worker._asks()
    assert [endpoint_id for endpoint_id, _, _ in refill] == [1]
    assert refill[0][1] >= 200, "the claim asks for what woke it: the depth at the wake less the queue"


def test_the_mean_a_lane_woke_with_sizes_only_the_claim_it_woke() -> None:
    worker = _worker(claim_batch=200, max_in_flight=512)
    lane = _queued_lane(worker, 200, mean=0.001)
    worker._wake_if_low(lane)
    lane.mean = running_mean(lane.mean, 0.024)
    worker._asks()
    worker._settle_refills([(1, lane.asked, False)], [], answered=False)  # that claim failed: nothing came
    refill, _ = worker._asks()
    assert refill == [], "the next claim sizes the lane by its mean now"


def test_a_lane_that_woke_the_claimer_still_gets_nothing_past_its_turn() -> None:
    worker = _worker(claim_batch=200, max_in_flight=512)
    lane = _queued_lane(worker, 200, mean=0.001)
    worker._wake_if_low(lane)
    lane.started -= worker.config.workers.lane_turn  # its turn ended before the claimer ran
    refill, _ = worker._asks()
    assert refill == [], "a lane held for its whole turn lets its slots go round, woken or not"
