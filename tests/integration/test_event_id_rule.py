"""The event-id rule has one home (``dispatcher.message.event_id_problem``: 1-200 visible ASCII
characters); the API's event-id parameters follow it.

* the pure parsers: ``params.event_id`` (a path id: 404) and ``params.query_event_id`` (a filter: 400)
  refuse exactly what the rule refuses;
* the API: an id the rule refuses is answered without a lookup, even where a row carries it (one
  written around the producer's check, as the engine's own tests write them).
"""

from __future__ import annotations

import urllib.parse

import falcon.testing
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api import params
from dispatcher.api.app import create_app
from dispatcher.api.auth import hash_token
from dispatcher.api.problems import Problem
from dispatcher.config import load_config
from dispatcher.message import EVENT_ID_MAX_CHARS, event_id_problem
from dispatcher_devtools.kit import query, seed_workspace

IDS = st.one_of(st.text(max_size=260), st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=260))


def _filter(event_id: str) -> str | None:
    req = falcon.testing.create_req(query_string=urllib.parse.urlencode({"event_id": event_id}))
    return params.query_event_id(req)


@given(event_id=IDS)
def test_the_parameters_refuse_exactly_what_the_rule_refuses(event_id: str) -> None:
    problem = event_id_problem(event_id)
    for parse, status in ((params.event_id, 404), (_filter, 400)):
        if problem is None:
            assert parse(event_id) == event_id
        else:
            with pytest.raises(Problem) as refused:
                parse(event_id)
            assert refused.value.status_code == status


@pytest.mark.parametrize("length", [201, 255])
def test_an_id_over_the_limit_is_not_looked_up(db, write_config, length: int) -> None:  # type: ignore[no-untyped-def]
    long_id = "e" * length
    assert EVENT_ID_MAX_CHARS < length
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES (%s, 'ws', 't', 1, '{}')",
          (long_id,))
    query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, event_day) "
                  "SELECT 'ws', %s, id, 'h', day FROM events WHERE workspace_id = 'ws' AND id = %s",
          (endpoint, long_id))
    query(db.dsn, "INSERT INTO api_tokens (token_sha256, workspace_id, scopes) VALUES (%s, 'ws', %s)",
          (hash_token("dsp_rule"), ["webhooks:read"]))
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    headers = {"Authorization": "Bearer dsp_rule"}
    try:
        client = falcon.testing.TestClient(app)
        listed = client.simulate_get("/v2/webhooks/deliveries", query_string=f"event_id={long_id}", headers=headers)
        history = client.simulate_get(f"/v2/events/{long_id}/deliveries", headers=headers)
        allowed = client.simulate_get("/v2/webhooks/deliveries", query_string="event_id=" + "e" * 200,
                                      headers=headers)
    finally:
        app.pool.close()
    assert listed.status_code == 400, listed.text
    assert f"over {EVENT_ID_MAX_CHARS}" in listed.json["detail"] and long_id not in listed.text
    assert history.status_code == 404, history.text
    assert allowed.status_code == 200 and allowed.json["data"] == []
