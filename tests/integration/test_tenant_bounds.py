"""What one tenant can make one request cost: a workspace owns a bounded number of
endpoints (inactive ones included), every list is paginated, and the largest
answer a token can ask for has a bounded size.

The sizes are the point: one workspace's 5,000 inactive endpoints made a stats
answer of 56 MB that held the API process (and every other tenant's request)
for seconds.  The bounds are asserted on the answers themselves, never on a
duration.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import falcon.testing
import pytest

from dispatcher.api import auth
from dispatcher.api.app import create_app
from dispatcher.api.params import MAX_STATS_BUCKETS, MAX_STATS_LIMIT
from dispatcher.config import load_config
from tests.integration import test_api
from tests.integration.test_api import World, assert_problem, bearer

MAX_ENDPOINTS = 100           # endpoints a workspace may own, active or not (migration 0018)
LARGEST_ANSWER = 512 * 1024  # bytes: the largest stats page a token can ask for stays under this

world = test_api.world
Client = falcon.testing.TestClient


@pytest.fixture
def client(db: Any, write_config: Any) -> Iterator[Client]:
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    yield falcon.testing.TestClient(app)
    app.pool.close()


def _fill(world: World, ws: str, count: int) -> None:
    """``count`` inactive endpoints, inserted as an outside tool would (the trigger still applies)."""
    world.sql("INSERT INTO webhook_endpoints (workspace_id, url, active)"
              " SELECT %s, 'https://hooks.example.test/in/' || n, false FROM generate_series(1, %s) n", (ws, count))


def _create(client: Client, token: str, active: bool) -> falcon.testing.Result:
    return client.simulate_post("/v2/webhooks/endpoints", headers=bearer(token),
                                json={"url": "https://hooks.example.test/new", "active": active})


def test_a_workspace_owns_a_bounded_number_of_endpoints_inactive_ones_included(world: World,
                                                                               client: Client) -> None:
    world.workspace("hoarder")
    token = world.token("hoarder", auth.READ, auth.WRITE)
    _fill(world, "hoarder", MAX_ENDPOINTS - 1)
    assert _create(client, token, active=False).status_code == 201
    body = assert_problem(_create(client, token, active=False), 409)
    assert f"{MAX_ENDPOINTS} endpoints" in body["detail"]
    assert world.count("true") == 0  # nothing else was written
    assert world.sql("SELECT count(*) FROM webhook_endpoints WHERE workspace_id = 'hoarder'") == [(MAX_ENDPOINTS,)]
    # Another workspace is not affected by this one's hoard.
    world.workspace("neighbour")
    assert _create(client, world.token("neighbour", auth.READ, auth.WRITE), active=False).status_code == 201


def _all_stats(client: Client, token: str, query: str) -> tuple[list[int], list[int]]:
    """The endpoint ids of every stats page, following next_cursor, and each answer's size in bytes."""
    ids: list[int] = []
    sizes: list[int] = []
    cursor = None
    for _ in range(MAX_ENDPOINTS + 2):
        result = client.simulate_get("/v2/webhooks/endpoints/stats", headers=bearer(token),
                                     query_string=query + (f"&cursor={cursor}" if cursor else ""))
        assert result.status_code == 200, result.text
        sizes.append(len(result.content))
        ids += [row["endpoint_id"] for row in result.json["data"]]
        cursor = result.json["next_cursor"]
        if cursor is None:
            break
    return ids, sizes


def test_endpoint_stats_are_paginated_and_the_largest_page_is_bounded(world: World, client: Client) -> None:
    world.workspace("big")
    _fill(world, "big", MAX_ENDPOINTS)
    token = world.token("big", auth.READ)
    owned = sorted((r[0] for r in world.sql("SELECT id FROM webhook_endpoints WHERE workspace_id = 'big'")),
                   reverse=True)
    ids, sizes = _all_stats(client, token, "limit=7&window=24h&buckets=4")
    assert ids == owned  # every endpoint once, newest first, in pages of 7
    assert len(sizes) == -(-MAX_ENDPOINTS // 7)
    # The default page is bounded, and so is the largest page a token can ask for.
    default = client.simulate_get("/v2/webhooks/endpoints/stats", headers=bearer(token))
    assert len(default.json["data"]) < MAX_ENDPOINTS and default.json["next_cursor"] is not None
    ids, sizes = _all_stats(client, token, f"limit={MAX_STATS_LIMIT}&window=7d&buckets={MAX_STATS_BUCKETS}")
    assert ids == owned
    assert max(sizes) < LARGEST_ANSWER
    assert_problem(client.simulate_get("/v2/webhooks/endpoints/stats", headers=bearer(token),
                                       query_string=f"limit={MAX_STATS_LIMIT + 1}"), 400)


ATTEMPTS_INLINE = 3  # attempts of each delivery an event's history shows inline (the last ones)


def test_an_events_largest_deliveries_page_is_bounded(world: World, client: Client) -> None:
    """100 deliveries of one event (replays make any number) with 21 attempts each and full excerpts
    of 2-byte characters (the largest in JSON, which escapes each as 6 bytes):
    inlined whole that was over 1 MB; the page shows each delivery's last attempts and says how many
    more the delivery's own route has."""
    world.workspace("noisy")
    endpoint = world.endpoint("noisy")
    event = world.event("noisy", "evt_noisy")
    world.sql("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, attempt, status)"
              " SELECT 'noisy', %s, %s, 'h', 21, 'dead' FROM generate_series(1, 101)", (endpoint, event))
    world.sql("INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, duration_ms,"
              " result, status_code, error, response_excerpt)"
              " SELECT d.id, d.endpoint_id, n, now() - make_interval(mins => 30 - n), 120, 'http_5xx', 500, %s, %s"
              " FROM webhook_deliveries d, generate_series(1, 21) n WHERE d.event_id = %s",
              ("HTTP 500 " + "e" * 190, "é" * 128, event))  # 256 bytes, 768 in JSON (\u00e9)
    token = world.token("noisy", auth.READ, auth.WRITE)
    result = client.simulate_get(f"/v2/events/{event}/deliveries", headers=bearer(token), query_string="limit=100")
    assert result.status_code == 200, result.text
    assert len(result.content) < LARGEST_ANSWER, len(result.content)
    first = result.json["data"][0]
    assert len(result.json["data"]) == 100 and result.json["next_cursor"] is not None
    assert [a["attempt"] for a in first["attempts"]] == list(range(22 - ATTEMPTS_INLINE, 22))
    assert first["attempts_omitted"] == 21 - ATTEMPTS_INLINE
    # The delivery's own route has them all.
    whole = client.simulate_get(f"/v2/webhooks/deliveries/{first['id']}", headers=bearer(token))
    assert [a["attempt"] for a in whole.json["attempts"]] == list(range(1, 22))
