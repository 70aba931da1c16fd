"""The breaker rule has one home (``dispatcher.rules.breaker``); everything that must
agree with it is tested here against the same table of cases:

* the pure rule: :meth:`BreakerPolicy.admits` and :meth:`BreakerPolicy.shown_state`;
* the claim SQL (``engine_claim``): send, probe or skip a due row;
* the API's display of the breaker (``GET /v2/webhooks/endpoints/{id}``) and of the
  rows it holds (a delivery's ``breaker_hold``, :meth:`BreakerPolicy.holds`);
* the fast path of a flush (``engine_breaker_touch``'s ``state = 'closed'``
  guard), which is exact only where the stored row is closed.
"""

from __future__ import annotations

from dataclasses import dataclass

import falcon.testing
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.app import create_app
from dispatcher.api.auth import hash_token
from dispatcher.config import load_config
from dispatcher.rules.breaker import CLOSED, BreakerBatch, BreakerPolicy, BreakerSignal, EndpointBreaker, Signal
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher_devtools.kit import query, seed_workspace

POLICY = BreakerPolicy(failure_threshold=20, open_for=300.0)
T0 = 1_800_000_000.0


@dataclass(frozen=True)
class Case:
    name: str
    state: str
    failures: int
    open_until: float | None  # seconds from now; None: no deadline stored
    admission: str            # send, probe or skip
    shown: str                # what customers see

    def breaker(self, now: float) -> EndpointBreaker:
        return EndpointBreaker(self.state, self.failures, None if self.open_until is None else now + self.open_until)


CASES = [
    Case("closed", "closed", 0, None, "send", "closed"),
    Case("closed with failures", "closed", 19, None, "send", "closed"),
    Case("open, window running", "open", 20, 120.0, "skip", "open"),
    Case("open, window lapsed", "open", 20, -5.0, "probe", "half_open"),
    Case("open, no deadline", "open", 20, None, "probe", "half_open"),
    Case("half open, probe in flight", "half_open", 20, 30.0, "skip", "half_open"),
    Case("half open, probe lease lapsed", "half_open", 20, -5.0, "probe", "half_open"),
]
IDS = [case.name for case in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_rule(case: Case) -> None:
    breaker = case.breaker(T0)
    assert POLICY.admits(breaker, T0) == case.admission
    assert POLICY.shown_state(breaker, T0) == case.shown
    # A row due now waits for the breaker exactly while the claim skips its endpoint;
    # a row due after the window keeps its own time.
    assert POLICY.holds(breaker, T0, T0) == (case.admission == "skip")
    assert not POLICY.holds(breaker, T0 + 600.0, T0)


def _seed_case(db, case: Case) -> int:  # type: ignore[no-untyped-def]
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES ('ev', 'ws', 't', 1, '{}')")
    query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, event_day) "
                  "SELECT 'ws', %s, id, 'h', day FROM events WHERE workspace_id = 'ws' AND id = 'ev'", (endpoint,))
    query(db.dsn, "INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until) "
                  "VALUES (%s, %s, %s, now() + make_interval(secs => %s))",
          (endpoint, case.state, case.failures, case.open_until))
    return endpoint


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_claim_follows_the_rule(db, case: Case) -> None:
    _seed_case(db, case)
    rows = EngineStore(ManagedConnection(db.dsn, "test")).claim("w", 10, 4, [], 0, 30.0)
    claimed = "skip" if not rows else ("probe" if rows[0].is_probe else "send")
    assert claimed == case.admission


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_api_shows_the_rule(db, write_config, case: Case) -> None:
    endpoint = _seed_case(db, case)
    query(db.dsn, "INSERT INTO api_tokens (token_sha256, workspace_id, scopes) VALUES (%s, 'ws', %s)",
          (hash_token("dsp_rule"), ["webhooks:read"]))
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    headers = {"Authorization": "Bearer dsp_rule"}
    try:
        client = falcon.testing.TestClient(app)
        response = client.simulate_get(f"/v2/webhooks/endpoints/{endpoint}", headers=headers)
        deliveries = client.simulate_get(f"/v2/webhooks/deliveries?endpoint_id={endpoint}", headers=headers)
    finally:
        app.pool.close()
    assert response.status_code == 200, response.text
    assert response.json["breaker"]["state"] == case.shown
    # The seeded row is due now: the API says it waits for the breaker where the rule holds it.
    (row,) = deliveries.json["data"]
    hold = row["breaker_hold"]
    assert (hold is not None) == (case.admission == "skip")
    if hold is not None:
        assert hold == {"state": case.shown, "until": response.json["breaker"]["open_until"]}


SIGNALS = st.lists(st.sampled_from(list(BreakerSignal)), min_size=1, max_size=30)


@given(failures=st.integers(0, 40), signals=SIGNALS, now=st.floats(0, 2e9))
def test_the_fast_path_is_exact_for_closed_rows(failures: int, signals: list[BreakerSignal], now: float) -> None:
    """``closed_writes`` is computed without reading the row; wherever it writes
    (a stored ``closed`` row, the SQL guard), it must equal the locked path."""
    batch = BreakerBatch(POLICY, [Signal(1, s, "err") for s in signals])
    fast = {w.endpoint_id: w for w in batch.closed_writes()}
    if BreakerSignal.SUCCESS not in signals:
        assert fast == {}
        return
    stored = EndpointBreaker("closed", failures, None)
    locked = batch.decide(1, stored, now)
    if 1 in fast:
        assert fast[1].breaker == locked.breaker
        assert (fast[1].succeeded, fast[1].failed, fast[1].error) == (locked.succeeded, locked.failed, locked.error)
        assert BreakerPolicy.transitions(stored, locked.breaker) is None, "nothing to announce on the fast path"
    else:
        assert locked.breaker.state == "open"


def test_a_batch_ignores_signals_that_say_nothing() -> None:
    batch = BreakerBatch(POLICY, [Signal(1, BreakerSignal.IGNORE, None)])
    assert batch.endpoint_ids == [] and batch.closed_writes() == []
    assert POLICY.after(CLOSED, [BreakerSignal.IGNORE], T0) == CLOSED
