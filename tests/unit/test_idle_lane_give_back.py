"""A lane the worker kept, empty, for the next claim gives its slots back at that claim when the claim will
not ask rows for it (docs/claim.md, "Holding a lane": "a slot is never kept idle").

``Worker._settle`` keeps an empty lane's slots while the very next claim can bring it rows.  But the claim may
come after the lane's turn ended (a slow claim under load), or after the process's other lanes took its budget;
the claim then asks nothing for the lane, and nothing else would look at it again until its lease's renewal, a
third of ``workers.lease`` later.  Found in W1: the last rows of two endpoints waited 14 s behind their own
slots, held by such lanes."""

from __future__ import annotations

import time
from typing import Any

from dispatcher.engine.worker import Lane, Worker
from dispatcher.rules.lane import LanePolicy
from tests.unit.unconnected import unconnected_worker


def _worker(**workers: Any) -> Worker:
    # Never connected: the lane bookkeeping under test is the worker's own, in memory.
    return unconnected_worker(processes=1, lane_turn="5s", **workers)


def _idle_lane(worker: Worker, endpoint_id: int, slots: int, held_for: float) -> Lane:
    """A lane as ``_settle`` leaves it kept: slots granted, nothing queued, no sender, no rows asked for."""
    now = time.monotonic()
    lane = Lane(started=now - held_for, renewed=now - held_for, grants={7: slots})
    worker._lanes[endpoint_id] = lane
    worker._slots += slots
    return lane


def test_an_empty_lane_past_its_turn_gives_its_slots_back_at_the_next_claim() -> None:
    worker = _worker()
    _idle_lane(worker, 1, slots=4, held_for=6.0)  # kept at 4.9 s; the claim came at 6 s
    assert worker._refills(room=500) == [], "no rows are asked for a lane past its turn"
    assert 1 not in worker._lanes, "the lane was let go"
    assert worker._slots == 0
    assert [(e.endpoint_id, e.token, e.keep) for e in worker._slot_entries] == [(1, 7, 0)], \
        "its slots go back with the next flush"


def test_an_empty_lane_whose_budget_the_other_lanes_took_gives_its_slots_back() -> None:
    # 8 rows in flight at most: with 5 slots held by lanes in all, no lane may queue two rows a slot.
    worker = _worker(max_in_flight=8)
    _idle_lane(worker, 1, slots=1, held_for=0.5)
    busy = _idle_lane(worker, 2, slots=4, held_for=0.5)
    busy.active = 4
    assert worker._refills(room=4) == []
    assert 1 not in worker._lanes and worker._lanes.get(2) is busy, "only the idle lane was let go"
    assert worker._slots == 4


def test_an_empty_lane_the_claim_will_refill_keeps_its_slots() -> None:
    worker = _worker()
    lane = _idle_lane(worker, 1, slots=4, held_for=1.0)
    policy = LanePolicy(lease=60.0, deadline=worker.config.http.timeout)
    expected = policy.refill(4, 0, lane.mean, 1.0, policy.budget(worker.config.workers.max_in_flight, 4, 4))
    assert expected > 0
    assert worker._refills(room=500) == [(1, expected, False)]
    assert worker._lanes.get(1) is lane and lane.asked == expected and worker._slots == 4
