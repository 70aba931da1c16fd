"""The lane rule (``dispatcher.rules.lane``): how far a lane queues ahead, when it asks for more, when
it lets its slots go round, and which queued rows it may still send.  Pure: the times are arguments."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.rules.lane import FIRST_GUESS, LanePolicy, running_mean

POLICY = LanePolicy(lease=60.0, deadline=10.0, horizon=0.25, turn=5.0, cap=200)


@pytest.mark.parametrize(("slots", "mean", "depth"), [
    (4, 0.01, 100),     # a 10 ms endpoint: a quarter second of its work for 4 senders
    (4, 0.0, 200),      # answering at once: the cap
    (4, 1.0, 4),        # slower than the horizon: one row a slot
    (2, 30.0, 2),
    (1, FIRST_GUESS, 5),
])
def test_a_lane_queues_a_horizon_of_the_endpoints_work(slots: int, mean: float, depth: int) -> None:
    assert POLICY.depth(slots, mean, 512) == depth


@pytest.mark.parametrize(("queued", "held_for", "want"), [
    (0, 0.0, 100),      # empty: the whole depth
    (50, 1.0, 50),      # down to half: the rest
    (51, 1.0, 0),       # more than half queued: not yet
    (0, 5.0, 0),        # its turn is over: no more rows, the lane drains and lets its slots go round
])
def test_a_lane_asks_at_half_depth_until_its_turn_ends(queued: int, held_for: float, want: int) -> None:
    assert POLICY.refill(4, queued, 0.01, held_for, 512) == want


def test_a_lane_without_slots_asks_for_nothing() -> None:
    assert POLICY.refill(0, 0, 0.01, 0.0, 512) == 0


def test_without_lane_hold_a_lane_never_asks_for_rows() -> None:
    assert LanePolicy(lease=60.0, deadline=10.0, hold=False).refill(4, 0, 0.01, 0.0, 512) == 0


@pytest.mark.parametrize(("budget", "want"), [(8, 8), (7, 0), (1, 0)])
def test_with_too_many_lanes_to_queue_ahead_a_lane_asks_for_nothing(budget: int, want: int) -> None:
    assert POLICY.refill(4, 0, 0.01, 0.0, budget) == want


@pytest.mark.parametrize(("since_renewed", "due"), [(0.0, False), (19.9, False), (20.0, True)])
def test_the_slots_lease_is_renewed_a_third_of_the_way_through(since_renewed: float, due: bool) -> None:
    assert POLICY.renewal_due(since_renewed) is due


@pytest.mark.parametrize(("since_claimed", "since_renewed", "sendable"), [
    (0.0, 0.0, True),
    (48.9, 0.0, True),     # 11.1 s of lease left: one deadline and the margin fit
    (49.0, 0.0, False),    # the row's own lease would lapse mid-attempt
    (0.0, 49.0, False),    # its lane's slots would
])
def test_a_queued_row_is_sent_only_while_both_leases_outlast_a_deadline(
        since_claimed: float, since_renewed: float, sendable: bool) -> None:
    assert POLICY.sendable(since_claimed, since_renewed) is sendable


@pytest.mark.parametrize(("budget", "depth"), [(512, 100), (20, 20), (1, 4)])
def test_many_lanes_share_what_the_process_may_hold(budget: int, depth: int) -> None:
    # 512 rows over 25 lanes: 20 each; never below a row a slot.
    assert POLICY.depth(4, 0.01, budget) == depth


@given(slots=st.integers(1, 64), mean=st.floats(0.0, 100.0), queued=st.integers(0, 500),
       held_for=st.floats(0.0, 4.99), budget=st.integers(1, 1000))
def test_a_refill_never_queues_past_the_cap_nor_leaves_a_slot_without_a_row(
        slots: int, mean: float, queued: int, held_for: float, budget: int) -> None:
    depth = POLICY.depth(slots, mean, budget)
    assert slots <= depth <= max(slots, min(POLICY.cap, budget))
    want = POLICY.refill(slots, queued, mean, held_for, budget)
    assert want >= 0 and (want == 0 or queued + want == depth)
    assert budget >= 2 * slots or want == 0


@pytest.mark.parametrize(("seconds", "depth"), [
    (0.0, 200),         # answering at once: the next refill asks for the cap, not a guess's 10 rows
    (0.01, 50),         # 10 ms: a quarter second of its work for 2 senders
    (1.0, 2),           # slower than the horizon: one row a slot, not the guess's 10
])
def test_the_first_measured_attempt_replaces_the_guess(seconds: float, depth: int) -> None:
    assert POLICY.depth(2, None, 512) == POLICY.depth(2, FIRST_GUESS, 512) == 10
    mean = running_mean(None, seconds)
    assert mean == seconds
    assert POLICY.depth(2, mean, 512) == depth
    assert POLICY.refill(2, 0, mean, 0.0, 512) == depth


def test_the_running_mean_follows_the_endpoint() -> None:
    mean = FIRST_GUESS
    for _ in range(50):
        mean = running_mean(mean, 1.0)
    assert mean == pytest.approx(1.0, rel=1e-3)


def test_a_flush_writes_one_entry_per_slot_key_the_last() -> None:
    from dispatcher.engine.worker import latest_entries
    from dispatcher.store.engine import SlotEntry

    written = latest_entries([SlotEntry(1, 7, 3), SlotEntry(2, 7, 1), SlotEntry(1, 7, 2), SlotEntry(1, 7, 0, 1, 9.5)])
    assert written == [SlotEntry(1, 7, 0, 1, 9.5), SlotEntry(2, 7, 1)]


@pytest.mark.parametrize(("slots", "slots_held", "budget"), [
    (2, 2, 512),        # one hot lane: it may hold up to what the process holds
    (2, 0, 512),
    (4, 128, 16),       # 32 lanes of 4: four rows a slot
    (2, 200, 5),        # 100 lanes of 2 (100 endpoints shared by two processes): two and a half rows a slot
    (4, 256, 8),        # slots on half of what the process holds: two rows a slot, the least that queues ahead
    (4, 260, 7),        # past half: a spread load, no lane queues ahead
    (4, 512, 4),
])
def test_a_lanes_budget_is_its_part_by_slots_of_what_the_process_holds(slots: int, slots_held: int,
                                                                       budget: int) -> None:
    assert POLICY.budget(512, slots, slots_held) == budget


@pytest.mark.parametrize(("slots_held", "want"), [(256, 8), (260, 0)])
def test_a_process_whose_slots_fill_half_its_room_queues_no_lane_ahead(slots_held: int, want: int) -> None:
    assert POLICY.refill(4, 0, 0.01, 0.0, POLICY.budget(512, 4, slots_held)) == want


def test_without_lane_hold_no_lane_has_a_budget() -> None:
    assert LanePolicy(lease=60.0, deadline=10.0, hold=False).budget(512, 2, 2) == 0


@pytest.mark.parametrize(("slots", "held_for", "more"), [
    (1, 0.0, True),     # below its process's share (2 of 4): always
    (2, 0.5, False),    # its share, too early: a peer may be taking its own
    (2, 1.0, True),     # its share for PEER_GRACE: the slots left free are no peer's
    (3, 4.9, True),
    (4, 2.0, False),    # the endpoint's whole limit
    (2, 5.0, False),    # its turn is over: the slots go round, a later peer gets them
])
def test_a_lane_takes_the_slots_its_peers_leave_free_after_a_grace(slots: int, held_for: float, more: bool) -> None:
    assert POLICY.takes_more(slots, 2, 4, held_for) is more


def test_without_lane_hold_a_lane_takes_no_more_than_its_share() -> None:
    policy = LanePolicy(lease=60.0, deadline=10.0, hold=False)
    assert policy.takes_more(1, 2, 4, 2.0) and not policy.takes_more(2, 2, 4, 2.0)
