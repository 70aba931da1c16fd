"""The per-endpoint limits have one home (``dispatcher.rules.limits.EndpointLimits``);
everything that must agree with it is tested here against the same table of cases:

* the pure rule: ``room`` and ``after``, where the slots held are the live
  leases plus the timed-out slots still in their hold (``slot_hold``); a lapsed
  lease holds nothing;
* the SQL twins in migration 0006 (``dispatcher_room``, ``dispatcher_bucket_after``);
* the function the claim asks for room (``dispatcher_lane_free``, migration
  0013), on the lease ledger and bucket as the claim and the result write leave them;
* the claim itself (``engine_claim``): with those leases, holds and that
  bucket, it takes exactly ``room`` due rows and leaves the bucket at ``after``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from dispatcher.rules.limits import EndpointLimits, slot_hold
from dispatcher.store.engine import AttemptRecord, ClaimedRow, EngineStore, ManagedConnection, SlotEntry
from dispatcher_devtools.kit import query, seed_workspace
from tests.support.partitions import event_day_sql

EVENT_DAY = event_day_sql("'ws'", "'ev'")


@dataclass(frozen=True)
class Case:
    name: str
    concurrency: int
    rate: float | None
    in_flight: int         # rows leased by another claim, lease running
    stored: float | None   # the bucket's tokens; None: no bucket yet
    elapsed: float         # seconds since the bucket was written
    room: int
    after: float | None    # the bucket once ``room`` rows were taken
    held: int = 0          # timed-out slots still in their hold after the result write
    lapsed: int = 0        # rows whose claim's lease lapsed (the owner died): due again

    @property
    def slots_taken(self) -> int:
        return self.in_flight + self.held


CASES = [
    Case("idle, no rate", 4, None, 0, None, 0.0, 4, None),
    Case("two in flight", 4, None, 2, None, 0.0, 2, None),
    Case("lane full", 4, None, 4, None, 0.0, 0, None),
    Case("over the limit (config lowered)", 4, None, 6, None, 0.0, 0, None),
    Case("new bucket is full", 4, 2.0, 0, None, 0.0, 2, 0.0),
    Case("fast endpoint, concurrency binds", 4, 100.0, 1, None, 0.0, 3, 97.0),
    Case("empty bucket, refilled 1.5 tokens", 4, 1.0, 0, 0.0, 1.5, 1, 0.0),
    Case("refill stops at the burst", 4, 2.0, 0, 0.0, 60.0, 2, 0.0),
    Case("slow rate still sends one", 4, 0.5, 0, None, 0.0, 1, 0.0),
    Case("half a token is not a row", 4, 0.5, 0, 0.0, 1.0, 0, 0.5),
    Case("lane full keeps the tokens", 4, 10.0, 4, 3.0, 0.1, 0, 4.0),
    Case("lapsed leases hold nothing", 4, None, 0, None, 0.0, 4, None, lapsed=4),
    Case("timed-out slots stay held", 4, None, 1, None, 0.0, 1, None, held=2),
    Case("leases, holds and lapses together", 4, None, 1, None, 0.0, 2, None, held=1, lapsed=3),
    Case("holds fill the lane, tokens kept", 4, 5.0, 2, 3.0, 0.0, 0, 3.0, held=2),
]
IDS = [case.name for case in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_rule(case: Case) -> None:
    limits = EndpointLimits(case.concurrency, case.rate)
    assert limits.room(case.slots_taken, case.stored, case.elapsed) == case.room
    after = limits.after(case.stored, case.elapsed, case.room)
    assert after == pytest.approx(case.after) if case.after is not None else after is None


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_sql_functions_agree(db, case: Case) -> None:
    (room, after), = query(db.dsn, "SELECT dispatcher_room(%s, %s, %s, %s, %s), "
                                   "dispatcher_bucket_after(%s, %s, %s, %s)",
                           (case.concurrency, case.slots_taken, case.rate, case.stored, case.elapsed,
                            case.rate, case.stored, case.elapsed, case.room))
    assert room == case.room
    assert after == pytest.approx(case.after) if case.after is not None else after is None


def _lease(db, endpoint: int, count: int, ends_in: str) -> None:  # type: ignore[no-untyped-def]
    """``count`` due rows leased by another process as the claim leases them (migration 0013): the lease in
    the row's unindexed columns, and the count in the endpoint's lane ledger."""
    if not count:
        return
    (token,), = query(db.dsn, "SELECT nextval('webhook_claim_tokens')")
    query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, "
                  "locked_until, locked_by, claim_token, event_day) "
                  "SELECT 'ws', %s, 'ev', 'h', now() + %s::interval, 'other', %s, "
                  + EVENT_DAY + " FROM generate_series(1, %s)",
          (endpoint, ends_in, token, count))
    query(db.dsn, "INSERT INTO endpoint_leases (endpoint_id, claim_token, owner, leased, until) "
                  "VALUES (%s, %s, 'other', %s, now() + %s::interval)", (endpoint, token, count, ends_in))


def _hold(db, endpoint: int, count: int) -> None:  # type: ignore[no-untyped-def]
    """``count`` timed-out slots as the result write holds them: a ledger entry keyed by a negated claim token."""
    if count:
        (token,), = query(db.dsn, "SELECT nextval('webhook_claim_tokens')")
        query(db.dsn, "INSERT INTO endpoint_leases (endpoint_id, claim_token, owner, leased, until) "
                      "VALUES (%s, %s, 'held after a timeout', %s, now() + interval '30 s')", (endpoint, -token, count))


def _seed_case(db, case: Case) -> int:  # type: ignore[no-untyped-def]
    """The endpoint of ``case``: its leases, holds, lapsed leases and bucket, and 10 due rows."""
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    query(db.dsn, "UPDATE webhook_endpoints SET max_per_second = %s WHERE id = %s", (case.rate, endpoint))
    query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES ('ev', 'ws', 't', 1, '{}')")
    # Rows leased by another process (due by time, but their lease ends in 30 s), then due rows.
    _lease(db, endpoint, case.in_flight, "30 s")
    _lease(db, endpoint, case.lapsed, "-1 s")
    _hold(db, endpoint, case.held)
    query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, event_day) "
                  "SELECT 'ws', %s, 'ev', 'h', " + EVENT_DAY + " FROM generate_series(1, 10)", (endpoint,))
    if case.stored is not None:
        query(db.dsn, "INSERT INTO endpoint_rate (endpoint_id, tokens, refilled_at) "
                      "VALUES (%s, %s, now() - make_interval(secs => %s))", (endpoint, case.stored, case.elapsed))
    return endpoint


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_claims_room_function_agrees(db, case: Case) -> None:
    endpoint = _seed_case(db, case)
    assert query(db.dsn, "SELECT dispatcher_lane_free(%s, %s, %s)", (endpoint, case.concurrency, case.rate)) == [
        (case.room,)]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_claim_agrees(db, case: Case) -> None:
    endpoint = _seed_case(db, case)
    rows = EngineStore(ManagedConnection(db.dsn, "test")).claim("w", 200, case.concurrency, [], 0, 30.0)
    assert len(rows) == case.room
    bucket = query(db.dsn, "SELECT tokens FROM endpoint_rate WHERE endpoint_id = %s", (endpoint,))
    if case.rate is None:
        assert bucket == []
    elif case.room:
        # The claim's own clock is a few ms past the case's elapsed: refill is at most that much more.
        assert bucket[0][0] == pytest.approx(case.after, abs=0.05 * case.rate + 1e-9)
    else:  # nothing taken, nothing written: the level is computed from refilled_at when needed
        assert bucket == ([] if case.stored is None else [(case.stored,)])


def test_a_lapsed_lease_does_not_hold_a_slot(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES ('ev', 'ws', 't', 1, '{}')")
    # A crashed owner's rows: token still set, lease over, due again.
    _lease(db, endpoint, 4, "-1 s")
    rows = EngineStore(ManagedConnection(db.dsn, "test")).claim("w", 200, 4, [], 0, 30.0)
    assert len(rows) == 4


@pytest.mark.parametrize(("result", "hold"), [("timeout", 10.0), ("delivered", 0.0), ("http_5xx", 0.0),
                                              ("connection", 0.0), ("protocol", 0.0)])
def test_only_a_timed_out_attempt_holds_its_slot_and_for_one_deadline(result: str, hold: float) -> None:
    assert slot_hold(result, 10.0) == hold


def test_the_result_write_holds_a_timed_out_slot_until_its_hold_lapses(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES ('ev', 'ws', 't', 1, '{}')")
    query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, event_day) "
              "SELECT 'ws', %s, 'ev', 'h', " + EVENT_DAY + " FROM generate_series(1, 10)", (endpoint,))
    engine = EngineStore(ManagedConnection(db.dsn, "test"))
    claimed = engine.claim("w", 200, 4, [], 0, 30.0)
    assert len(claimed) == 4

    def result(row: ClaimedRow, label: str, hold: float) -> AttemptRecord:
        return AttemptRecord(row.id, row.claim_token, row.endpoint_id, "pending", row.attempt, 0.0, label, None,
                             label, time.monotonic(), 1, None, hold)

    # Two time out, one is refused, one is still in flight; the lane gives back the two timed-out slots
    # with their hold and keeps the other two.
    first, second, third, fourth = claimed
    hold = slot_hold("timeout", 60.0)
    engine.record([result(first, "timeout", hold), result(second, "timeout", hold),
                   result(third, "connection", slot_hold("connection", 60.0))],
                  [SlotEntry(endpoint, first.claim_token, 2, 2, hold)])
    room = "SELECT dispatcher_lane_free(%s, 4, NULL)"
    assert query(db.dsn, room, (endpoint,)) == [(0,)]  # 2 kept, 2 held
    engine.record([result(fourth, "delivered", slot_hold("delivered", 60.0))],
                  [SlotEntry(endpoint, first.claim_token, 0)])
    assert query(db.dsn, room, (endpoint,)) == [(2,)]  # 2 held
    query(db.dsn, "UPDATE endpoint_leases SET until = now() - interval '1 s' WHERE claim_token < 0")
    assert query(db.dsn, room, (endpoint,)) == [(4,)]  # the hold lapsed
