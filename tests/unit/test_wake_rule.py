"""The wake rule (``dispatcher.rules.wake``): when an idle worker claims before its poll."""

from __future__ import annotations

import pytest

from dispatcher.rules.wake import WakeMark, WakeWatch


def mark(last_id: int, *in_progress: int) -> WakeMark:
    return WakeMark(last_id, frozenset(in_progress))


def test_a_first_reading_claims() -> None:
    watch, claim = WakeWatch().after(mark(10))
    assert claim
    assert watch == WakeWatch(10, frozenset())


def test_nothing_new_and_nothing_ended_does_not_claim() -> None:
    watch, claim = WakeWatch(10, frozenset({7})).after(mark(10, 7, 8))
    assert not claim
    assert watch == WakeWatch(10, frozenset({7}))


def test_a_moved_sequence_claims_and_watches_what_is_in_progress() -> None:
    watch, claim = WakeWatch(10).after(mark(12, 7, 8))
    assert claim
    assert watch == WakeWatch(12, frozenset({7, 8}))


@pytest.mark.parametrize(("in_progress", "claim", "waiting"), [
    ((8,), True, {8}),      # 7 ended: its rows may be visible now
    ((), True, set()),      # both ended
    ((7, 8, 9), False, {7, 8}),  # a transaction that began after the move says nothing
])
def test_a_transaction_in_progress_at_a_move_claims_when_it_ends(in_progress: tuple[int, ...], claim: bool,
                                                                 waiting: set[int]) -> None:
    watch, claimed = WakeWatch(12, frozenset({7, 8})).after(mark(12, *in_progress))
    assert claimed is claim
    assert watch == WakeWatch(12, frozenset(waiting))


def test_a_producer_holding_its_rows_wakes_the_worker_at_its_commit() -> None:
    """The sequence moves while the producer's transaction (7) is open: the claim then finds
    nothing; the readings after it claim nothing more until 7 ends, and then once."""
    watch, claims = WakeWatch(), []
    for reading in (mark(1), mark(5, 7), mark(5, 7), mark(5, 7, 9), mark(5, 9), mark(5, 9), mark(5)):
        watch, claim = watch.after(reading)
        claims.append(claim)
    assert claims == [True, True, False, False, True, False, False]
