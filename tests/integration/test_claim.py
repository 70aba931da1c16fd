"""The claim, the fence and fairness, at the store level against a real Postgres."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg2
import pytest

from dispatcher.store import QUERIES
from dispatcher.store.engine import (
    EVERY_ID,
    RESULT_FIELDS,
    AttemptRecord,
    ClaimedRow,
    EngineStore,
    ManagedConnection,
    SlotEntry,
    claimed_rows,
)
from dispatcher_devtools.kit import query, seed_workspace, wait_until
from tests.support.partitions import canonical_plan


def _store(db) -> EngineStore:  # type: ignore[no-untyped-def]
    return EngineStore(ManagedConnection(db.dsn, "test"))


def _pending(db, endpoint_id: int, count: int, event_id: str = "ev") -> None:  # type: ignore[no-untyped-def]
    query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES (%s, 'ws', 't', 1, '{}') "
                  "ON CONFLICT DO NOTHING", (event_id,))
    # The event's day (0027), or today's when the event is missing (its sequence was taken).
    query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, event_day) "
                  "SELECT 'ws', %s, %s, 'h', coalesce((SELECT day FROM events WHERE workspace_id = 'ws' AND id = %s),"
                  " dispatcher_today()) FROM generate_series(1, %s)", (endpoint_id, event_id, event_id, count))


def _record(row: ClaimedRow, status: str = "delivered") -> AttemptRecord:
    return AttemptRecord(row.id, row.claim_token, row.endpoint_id, status, row.attempt, 0.0, None, 200,
                         "delivered", time.monotonic(), 5, "ok")


def test_claim_stamps_a_lease_and_commits_before_returning(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 3)
    rows = _store(db).claim("owner-a", 10, 4, [], 0, 30.0)
    assert len(rows) == 3 and len({r.claim_token for r in rows}) == 1
    # Visible from another session at once: the claim transaction has committed.
    # The lease is in columns no index names (a HOT update, migration 0013): the due time stays, and
    # the endpoint's lane ledger holds what the claim took.
    leased = query(db.dsn, "SELECT locked_by, locked_until > now() + interval '25 seconds', "
                           "next_attempt_at <= now() FROM webhook_deliveries")
    assert leased == [("owner-a", True, True)] * 3
    assert query(db.dsn, "SELECT endpoint_id, claim_token, owner, leased, until > now() + interval '25 seconds' "
                         "FROM endpoint_leases") == [(endpoint, rows[0].claim_token, "owner-a", 3, True)]
    assert _store(db).claim("owner-b", 10, 4, [], 0, 30.0) == [], "leased rows are not due"
    row = rows[0]
    assert (row.attempt, row.event_type, row.url, row.active, row.is_probe) == (1, "t", "http://127.0.0.1:9/a",
                                                                                True, False)


def test_no_endpoint_fills_a_batch(db) -> None:
    flood, quiet = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/flood", "http://127.0.0.1:9/quiet"])
    _pending(db, flood, 5000)
    _pending(db, quiet, 3)
    rows = _store(db).claim("w", 200, 4, [], 0, 30.0)
    per_endpoint = {e: sum(1 for r in rows if r.endpoint_id == e) for e in (flood, quiet)}
    assert per_endpoint == {flood: 4, quiet: 3}


def test_busy_endpoints_are_skipped_and_the_cursor_rotates(db) -> None:
    endpoints = seed_workspace(db.dsn, "ws", [f"http://127.0.0.1:9/{n}" for n in range(6)])
    for endpoint in endpoints:
        _pending(db, endpoint, 10)
    store = _store(db)
    first = store.claim("w", 8, 2, [endpoints[0]], 0, 30.0)
    assert endpoints[0] not in {r.endpoint_id for r in first}
    assert {r.endpoint_id for r in first} == set(endpoints[1:5])
    # Starting after the last endpoint served, the walk wraps around to the start.
    second = store.claim("w", 4, 2, [], endpoints[4], 30.0)
    assert {r.endpoint_id for r in second} == {endpoints[5], endpoints[0]}


def test_stale_owner_is_fenced_out(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 1)
    store = _store(db)
    (stale,) = store.claim("stale", 1, 4, [], 0, 30.0)
    # The lease lapsed (as when its owner stalls): the row and its lane slot are free again.
    query(db.dsn, "UPDATE webhook_deliveries SET locked_until = now() - interval '1 second'")
    query(db.dsn, "UPDATE endpoint_leases SET until = now() - interval '1 second'")
    (fresh,) = store.claim("fresh", 1, 4, [], 0, 30.0)
    assert fresh.id == stale.id and fresh.claim_token != stale.claim_token
    assert store.record([_record(stale, "dead")]) == set(), "the stale worker's write is rejected"
    assert store.record([_record(fresh)]) == {fresh.id}
    assert query(db.dsn, "SELECT status FROM webhook_deliveries") == [("delivered",)]
    assert query(db.dsn, "SELECT claim_token FROM webhook_delivery_attempts") == [(fresh.claim_token,)]


def test_release_hands_rows_back_at_once_and_their_slots_when_named(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 4)
    store = _store(db)
    rows = store.claim("w1", 2, 4, [], 0, 300.0)
    assert store.release([(r.id, r.claim_token) for r in rows]) == 2
    assert store.release_owner("nobody") == 0
    assert query(db.dsn, "SELECT owner, leased FROM endpoint_leases") == [("w1", 2)], "a slot goes back when named"
    assert store.record([], [SlotEntry(endpoint, rows[0].claim_token, 0)]) == set()
    again = store.claim("w2", 10, 4, [], 0, 300.0)
    assert {r.id for r in rows} <= {r.id for r in again}
    assert query(db.dsn, "SELECT owner, leased FROM endpoint_leases") == [("w2", 4)], "w1's slots went back"
    assert store.release_owner("w2") == 4
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE locked_by IS NOT NULL") == [(0,)]
    assert query(db.dsn, "SELECT count(*) FROM endpoint_leases") == [(0,)]


def test_a_claim_after_its_owners_release_takes_nothing(db) -> None:
    # A worker that died with a claim on the wire: the server runs it after the supervisor released the
    # owner (docs/claim.md, "A dead owner's last claim").  It must take no row and no slot.
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 4)
    store = _store(db)
    assert store.release_owner("gone") == 0
    assert store.claim("gone", 10, 4, [], 0, 300.0) == []
    assert store.claim("gone", 0, 4, [], 0, 300.0, refill=[(endpoint, 4, True)]) == []
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE locked_by IS NOT NULL") == [(0,)]
    assert query(db.dsn, "SELECT count(*) FROM endpoint_leases") == [(0,)]
    assert len(store.claim("alive", 10, 4, [], 0, 300.0)) == 4, "another owner claims as before"


def test_releasing_an_owner_waits_for_its_claim_in_flight(db) -> None:
    # The claim is held inside its statement, past the point where it leases rows: a rate-limited
    # endpoint's bucket row is locked by another session, so the claim's token payment waits.  A release
    # of the owner meanwhile must not return before the claim has committed, or the claim's rows would
    # stay leased (and its slots held) by a dead owner until the lease lapsed.
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 3)
    query(db.dsn, "UPDATE webhook_endpoints SET max_per_second = 100")
    query(db.dsn, "INSERT INTO endpoint_rate (endpoint_id, tokens, refilled_at) VALUES (%s, 100, now())", (endpoint,))
    blocker = psycopg2.connect(db.dsn)
    try:
        with blocker.cursor() as cur:
            cur.execute("SELECT 1 FROM endpoint_rate WHERE endpoint_id = %s FOR UPDATE", (endpoint,))
        with ThreadPoolExecutor(2) as pool:
            claim = pool.submit(_store(db).claim, "dying", 10, 4, [], 0, 300.0)
            wait_until(lambda: _lock_waiters(db) >= 1, message="the claim waiting for the bucket's lock")
            release = pool.submit(_store(db).release_owner, "dying")
            # Without the fence the release ends here, having released nothing; with it, it waits.
            wait_until(lambda: release.done() or _lock_waiters(db) >= 2, message="the release ended or waiting")
            blocker.commit()
            assert len(claim.result(timeout=30)) == 3
            assert release.result(timeout=30) == 3
    finally:
        blocker.close()
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE locked_by IS NOT NULL") == [(0,)]
    assert query(db.dsn, "SELECT count(*) FROM endpoint_leases") == [(0,)]


def _lock_waiters(db) -> int:  # type: ignore[no-untyped-def]
    """Sessions of the test's database waiting for a lock."""
    ((waiting,),) = query(db.dsn, "SELECT count(*) FROM pg_stat_activity "
                                  "WHERE datname = current_database() AND wait_event_type = 'Lock'")
    return int(waiting)


def test_results_keep_the_slots_until_the_lane_names_what_it_keeps(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 10)
    store = _store(db)
    first = store.claim("w1", 10, 4, [], 0, 30.0)
    assert len(first) == 4 and all(r.grants_slot for r in first)
    assert store.claim("w2", 10, 4, [], 0, 30.0) == [], "the lane is full region-wide while rows are due"
    retry = AttemptRecord(first[0].id, first[0].claim_token, endpoint, "pending", 1, 0.0, "HTTP 500", 500,
                          "http_5xx", time.monotonic(), 5, None)
    assert store.record([retry, _record(first[1])]) == {first[0].id, first[1].id}
    assert query(db.dsn, "SELECT leased FROM endpoint_leases") == [(4,)], "a result alone gives no slot back"
    keep_two = [SlotEntry(endpoint, first[0].claim_token, 2)]
    assert store.record([retry, _record(first[1])], keep_two) == set(), "fenced: written once"
    # The same batch again (say, its commit was acknowledged too late): what the lane keeps is a count, not a
    # difference, so no slot goes back twice.
    assert store.record([], keep_two) == set()
    assert query(db.dsn, "SELECT leased FROM endpoint_leases") == [(2,)]
    assert len(store.claim("w2", 10, 4, [], 0, 30.0)) == 2
    assert store.record([_record(r) for r in first[2:]], [SlotEntry(endpoint, first[0].claim_token, 0)]) == \
        {r.id for r in first[2:]}
    assert query(db.dsn, "SELECT owner, leased FROM endpoint_leases") == [("w2", 2)], "an emptied entry is deleted"


def test_a_lane_holder_refills_without_new_slots_and_renews_their_lease(db) -> None:
    (endpoint, other) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"])
    _pending(db, endpoint, 20)
    _pending(db, other, 2, "ev2")
    store = _store(db)
    first = store.claim("w1", 10, 4, [], 0, 30.0)
    assert sorted(r.endpoint_id for r in first) == [endpoint] * 4 + [other] * 2
    query(db.dsn, "UPDATE endpoint_leases SET until = now() + interval '1 second'")
    leases = ("SELECT endpoint_id, leased, until > now() + interval '20 seconds' FROM endpoint_leases "
              "ORDER BY endpoint_id")
    more = store.claim("w1", 10, 4, [endpoint, other], 0, 30.0, refill=[(endpoint, 3, False)])
    assert [r.endpoint_id for r in more] == [endpoint] * 3 and not any(r.grants_slot for r in more)
    assert query(db.dsn, leases) == [(endpoint, 4, False), (other, 2, False)], "no renewal unless asked"
    more += store.claim("w1", 10, 4, [endpoint, other], 0, 30.0, refill=[(endpoint, 3, True)])
    assert [r.endpoint_id for r in more] == [endpoint] * 6 and not any(r.grants_slot for r in more)
    assert not {r.id for r in more} & {r.id for r in first}
    assert query(db.dsn, leases) == [(endpoint, 4, True), (other, 2, False)]
    assert store.claim("w2", 10, 4, [], 0, 30.0) == [], "the slots are w1's: nobody else sends"
    assert len(store.claim("w1", 10, 4, [endpoint], 0, 30.0, refill=[(endpoint, 50, False)])) == 10, "the rest"
    assert store.claim("w1", 10, 4, [endpoint], 0, 30.0, refill=[(endpoint, 50, False)]) == [], "dry"


@pytest.mark.parametrize("block", ["UPDATE endpoint_state SET state = 'open', open_until = now() + interval '1 h'",
                                   "UPDATE webhook_endpoints SET max_per_second = 100"])
def test_a_refill_takes_nothing_behind_an_open_breaker_or_a_rate_limit(db, block: str) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 10)
    store = _store(db)
    assert len(store.claim("w1", 10, 4, [], 0, 30.0)) == 4
    query(db.dsn, "INSERT INTO endpoint_state (endpoint_id) VALUES (%s) ON CONFLICT DO NOTHING", (endpoint,))
    query(db.dsn, block)
    assert store.claim("w1", 10, 4, [endpoint], 0, 30.0, refill=[(endpoint, 6, True)]) == []


def test_upkeep_deletes_lapsed_lane_entries(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 8)
    store = _store(db)
    stalled = store.claim("stalled", 4, 4, [], 0, 30.0)
    query(db.dsn, "UPDATE endpoint_leases SET until = now() - interval '1 second'")
    query(db.dsn, "UPDATE webhook_deliveries SET locked_until = now() - interval '1 second'")
    live = store.claim("live", 4, 4, [], 0, 30.0)
    assert len(stalled) == len(live) == 4
    assert store.prune_lapsed_leases() == 1
    assert query(db.dsn, "SELECT owner, leased FROM endpoint_leases") == [("live", 4)]


def test_upkeep_forgets_owner_names_retired_over_a_day_ago(db) -> None:
    store = _store(db)
    store.release_owner("old")
    store.release_owner("recent")
    query(db.dsn, "UPDATE retired_owners SET retired_at = now() - interval '25 hours' WHERE owner = 'old'")
    store.prune_lapsed_leases()
    assert query(db.dsn, "SELECT owner FROM retired_owners") == [("recent",)]


def test_open_breaker_rows_are_skipped_and_exactly_one_probe_is_claimed(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 5)
    query(db.dsn, "INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until) "
                  "VALUES (%s, 'open', 20, now() + interval '1 hour')", (endpoint,))
    store = _store(db)
    assert store.claim("w", 10, 4, [], 0, 30.0) == []
    query(db.dsn, "UPDATE endpoint_state SET open_until = now() - interval '1 second'")
    (probe,) = store.claim("w", 10, 4, [], 0, 30.0)
    assert probe.is_probe
    assert query(db.dsn, "SELECT state FROM endpoint_state") == [("half_open",)]
    assert store.claim("w2", 10, 4, [], 0, 30.0) == [], "one probe at a time across the fleet"
    assert query(db.dsn, "SELECT max(attempt) FROM webhook_deliveries") == [(0,)], "no attempt consumed"


@pytest.mark.parametrize("pending", [1000, 20000])
def test_claim_uses_the_pending_index(db, pending: int) -> None:
    endpoints = seed_workspace(db.dsn, "ws", [f"http://127.0.0.1:9/{n}" for n in range(10)])
    for endpoint in endpoints:
        _pending(db, endpoint, pending // 10)
    query(db.dsn, "ANALYZE webhook_deliveries")
    plan = "\n".join(r[0] for r in query(db.dsn, "EXPLAIN SELECT endpoint_id FROM webhook_deliveries "
                                                 "WHERE status = 'pending' AND endpoint_id > 0 "
                                                 "ORDER BY endpoint_id LIMIT 1"))
    # Each partition's own index (named as its parent's, webhook_deliveries_due).
    assert "webhook_deliveries_due" in canonical_plan(db.dsn, plan)


def test_a_fanned_out_event_crosses_the_wire_once_per_claim(db) -> None:
    endpoints = seed_workspace(db.dsn, "ws", [f"http://127.0.0.1:9/{n}" for n in range(5)])
    query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) "
                  "VALUES ('big', 'ws', 't', 1, jsonb_build_object('pad', repeat('x', 1000)))")
    for endpoint in endpoints:
        _pending(db, endpoint, 1, event_id="big")
    _pending(db, endpoints[0], 1, event_id="gone")
    query(db.dsn, "DELETE FROM events WHERE id = 'gone'")
    # On the wire (the claim statement itself, rolled back): the payload text once per event.
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(QUERIES["engine_claim"], {"owner": "w", "limit": 200, "per_endpoint": 4, "share": 4, "busy": [],
                                                  "after": 0, "lease": 30.0, "grace": 86400.0, "refill": "[]",
                                                  "floor": EVERY_ID.floor, "ceiling": EVERY_ID.ceiling})
            names = [c.name for c in cur.description]
            raw = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        conn.rollback()
    finally:
        conn.close()
    assert sum(1 for r in raw if r["event_id"] == "big") == 5
    assert sum(1 for r in raw if r["event_id"] == "big" and r["payload"] is not None) == 1
    rows = _store(db).claim("w", 200, 4, [], 0, 30.0)
    big = [r for r in rows if r.event_id == "big"]
    assert len(big) == 5 and all(r.payload == big[0].payload and '"pad"' in (r.payload or "") for r in big)
    assert len({id(r.payload) for r in big}) == 1, "one string shared by every row of the event"
    (gone,) = [r for r in rows if r.event_id == "gone"]
    assert gone.payload is None and gone.event_type is None, "a missing event still reads as missing"


def test_a_dispatcher_older_than_the_lease_ledger_claims_nothing(db) -> None:
    """An older dispatcher still running while 0013 is applied would read rows leased the new way (due time
    unchanged) as due and send them again outside the region-wide limit; its claim asks
    dispatcher_lane_room for room, and gets none (docs/operations.md, Upgrading)."""
    endpoints = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"])
    assert query(db.dsn, "SELECT dispatcher_lane_room(%s, 4, NULL), dispatcher_lane_room(%s, 4, 10.0)",
                 tuple(endpoints)) == [(0, 0)]
    assert query(db.dsn, "SELECT dispatcher_lane_free(%s, 4, NULL)", (endpoints[0],)) == [(4,)]


def test_the_claim_and_the_result_write_are_planned_each_time(db) -> None:
    """The claim's best plan depends on how big the outbox is, so it is made on every execution; the result
    write's too, with its ids, so that it reads only their partitions (store/engine.py KEPT_PLANS)."""
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 40)
    conn = ManagedConnection(db.dsn, "test")
    store = EngineStore(conn)
    for _ in range(10):
        rows = store.claim("w", 4, 4, [], 0, 30.0)
        assert store.record([_record(r) for r in rows]) == {r.id for r in rows}
    with conn.statement() as cur:
        cur.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements ORDER BY name")
        plans = {name: (generic, custom) for name, generic, custom in cur.fetchall()}
        cur.execute("SHOW plan_cache_mode")
        (mode,), = cur.fetchall()
    assert plans["engine_claim"] == (0, 10)
    assert plans["engine_record"] == (0, 10)
    assert mode == "force_custom_plan", "both want the same mode: it is set once per connection"
    conn.close()


def test_one_claim_takes_at_most_its_share_of_an_endpoint(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 10)
    store = _store(db)
    assert len(store.claim("w1", 10, 4, [], 0, 30.0, share=2)) == 2
    assert len(store.claim("w2", 10, 4, [], 0, 30.0, share=2)) == 2, "the other process takes the rest"
    assert store.claim("w3", 10, 4, [], 0, 30.0, share=2) == [], "and the region-wide 4 still holds"


def test_the_claim_hands_trace_contexts_over_as_text(db) -> None:
    """Text, not jsonb: psycopg2 would decode every row's; the worker parses one only when a span needs it."""
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 2)
    producer = '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'
    query(db.dsn, "UPDATE events SET trace_context = %s::jsonb", (producer,))
    query(db.dsn, "UPDATE webhook_deliveries SET trace_context = %s::jsonb "
                  "WHERE id = (SELECT min(id) FROM webhook_deliveries)", ('{"traceparent": "00-ab"}',))
    first, second = sorted(_store(db).claim("w", 10, 4, [], 0, 30.0), key=lambda r: r.id)
    assert (first.event_trace, first.delivery_trace) == (producer, '{"traceparent": "00-ab"}')
    assert (second.event_trace, second.delivery_trace) == (producer, None)


def _select_fields(names: tuple[str, ...]) -> str:
    """A SELECT of every ClaimedRow field, in ``names`` order, each a value its name tells apart."""
    return "SELECT " + ", ".join(f"'{name}'::text AS {name}" for name in names)


def test_claimed_rows_are_matched_to_their_fields_by_column_name(db) -> None:
    fields = ClaimedRow._fields
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            for names in (fields, tuple(reversed(fields))):
                cur.execute(_select_fields(names))
                (row,) = claimed_rows(cur)
                assert type(row) is ClaimedRow
                assert all(getattr(row, name) == name for name in fields), names
            cur.execute(_select_fields(tuple(name for name in fields if name != "secret")) + ", 1 AS surplus")
            with pytest.raises(ValueError, match=r"missing \['secret'\], extra \['surplus'\]"):
                claimed_rows(cur)
    finally:
        conn.close()


def test_every_field_of_a_result_lands_in_its_own_column(db) -> None:
    """Results travel by position (store/engine.py RESULT_FIELDS): each field distinct, so a field
    read from another's place shows in the row or the history written."""
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    _pending(db, endpoint, 1)
    store = _store(db)
    (row,) = store.claim("owner-a", 10, 4, [], 0, 30.0)
    traceparent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    record = AttemptRecord(row.id, row.claim_token, row.endpoint_id, "pending", row.attempt, 3600.0,
                           "HTTP 503: busy", 503, "http_5xx", time.monotonic() - 2.0, 1234, "busy",
                           traceparent=traceparent, trace_root=True, trace_id="c" * 32)
    assert store.record([record]) == {row.id}
    (delivery,) = query(db.dsn, "SELECT status, attempt, extract(epoch FROM next_attempt_at - now())"
                                " BETWEEN 3000 AND 3600, last_error, last_status_code,"
                                " trace_context->>'traceparent', locked_by FROM webhook_deliveries")
    assert delivery == ("pending", row.attempt, True, "HTTP 503: busy", 503, traceparent, None)
    (attempt,) = query(db.dsn, "SELECT delivery_id, endpoint_id, attempt, extract(epoch FROM now() - started_at)"
                               " BETWEEN 2 AND 600, duration_ms, result, status_code, error, response_excerpt,"
                               " claim_token, trace_id FROM webhook_delivery_attempts")
    assert attempt == (row.id, endpoint, row.attempt, True, 1234, "http_5xx", 503, "HTTP 503: busy", "busy",
                       row.claim_token, "c" * 32)


def test_the_result_write_reads_each_field_at_its_place_in_result_fields() -> None:
    """engine_record names its results' columns by position; store/engine.py writes them in
    RESULT_FIELDS' order: both lists are the same."""
    read = re.findall(r"\(?r->>(\d+)\)?(?:::\w+)? AS (\w+)", QUERIES["engine_record"])
    assert [(int(i), name) for i, name in read] == list(enumerate(RESULT_FIELDS))
