"""How often the claimer claims while a hot lane drains (docs/claim.md, "Queueing ahead" and "The worker keeps
claiming as capacity frees up").

A hot endpoint's lane refills from the claim.  Two rules kept those claims small and twice as many as they
needed to be (the fast `hot` case: 400 claims of about 100 rows for 40,000 deliveries):

* a refill was capped at the walk's batch (``workers.claim_batch``), not by the lane's budget and horizon;
* the claimer paused after a claim by all the rows it took, so a claim whose walk found nothing but whose
  refills brought rows was taken for busy, and the claimer walked again 50 ms later, for nothing; and a
  refill that took all the process's room left its claim no walk, so the claimer walked at once in a claim
  of its own.

The worker's bookkeeping is tested in memory, on a worker that never connects."""

from __future__ import annotations

import time
from typing import Any

from dispatcher.engine.worker import BUSY_POLL, Lane, Worker
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
