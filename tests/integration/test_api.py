"""The delivery-history API (issue 4) against a real Postgres.

Rows are seeded with plain SQL, the same contract outside tools use; the app
runs in-process through falcon.testing, except for the tests of the real
server process (dispatcher.runtime.api_main under gevent, started through the CLI).
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import falcon.inspect
import falcon.testing
import psycopg2
import pytest

from dispatcher.api import auth
from dispatcher.api.app import create_app
from dispatcher.config import load_config
from tests.conftest import REPO
from tests.support.partitions import event_day_sql

if TYPE_CHECKING:
    from tests.conftest import TestDatabase

ClientFactory = Callable[..., falcon.testing.TestClient]


class World:
    """Seeds rows with SQL, as the engine and outside tools would write them."""

    def __init__(self, db: TestDatabase) -> None:
        self.db = db
        self.conn = db.connect()
        self.conn.autocommit = True
        self._sequence = 0

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def workspace(self, ws: str) -> str:
        self.sql("INSERT INTO workspaces (id, secret) VALUES (%s, 'whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=')", (ws,))
        return ws

    def endpoint(self, ws: str, url: str = "https://hooks.example.test/in", active: bool = True,
                 types: tuple[str, ...] = ()) -> int:
        return int(self.sql("INSERT INTO webhook_endpoints (workspace_id, url, active, event_types) "
                            "VALUES (%s, %s, %s, %s) RETURNING id", (ws, url, active, list(types)))[0][0])

    def event(self, ws: str, event_id: str, type_: str = "job.completed") -> str:
        self._sequence += 1
        self.sql("INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES (%s, %s, %s, %s, %s)",
                 (event_id, ws, type_, self._sequence, json.dumps({"job": event_id})))
        return event_id

    def delivery(self, ws: str, endpoint: int, event: str, status: str = "pending", attempt: int = 0,
                 age: timedelta = timedelta(0), mode: str = "live", replay_of: int | None = None,
                 last_error: str | None = None) -> int:
        return int(self.sql(
            "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, attempt, status,"
            " mode, created_at, replay_of, last_error, locked_by, claim_token, event_day)"
            " VALUES (%s, %s, %s, 'sha256:' || md5(%s), %s, %s, %s, now() - %s, %s, %s, 'worker-7', 42,"
            "         coalesce((SELECT day FROM events WHERE workspace_id = %s AND id = %s), dispatcher_today()))"
            " RETURNING id",
            (ws, endpoint, event, event, attempt, status, mode, age, replay_of, last_error, ws, event))[0][0])

    def attempt(self, delivery: int, endpoint: int, n: int, result: str, status_code: int | None,
                error: str | None = None, excerpt: str | None = None, duration_ms: int = 120,
                ago: timedelta | None = None) -> None:
        """An attempt started ``ago`` (default: 10 - n minutes ago, so attempts of a row are in order)."""
        self.sql("INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, duration_ms,"
                 " result, status_code, error, response_excerpt) VALUES (%s, %s, %s, now() - %s, %s, %s, %s, %s, %s)",
                 (delivery, endpoint, n, timedelta(minutes=10 - n) if ago is None else ago, duration_ms, result,
                  status_code, error, excerpt))

    def token(self, ws: str, *scopes: str) -> str:
        return auth.create_token(self.conn, ws, list(scopes or (auth.READ, auth.WRITE)))

    def count(self, where: str = "true", params: Any = None) -> int:
        return int(self.sql(f"SELECT count(*) FROM webhook_deliveries WHERE {where}", params)[0][0])


@pytest.fixture
def world(db: TestDatabase) -> Iterator[World]:
    w = World(db)
    yield w
    w.conn.close()


@pytest.fixture
def make_client(db: TestDatabase, write_config: Any) -> Iterator[ClientFactory]:
    """An in-process client of a fresh app; each app is its own 'API process' with its own pool."""
    apps = []

    def make(**overrides: Any) -> falcon.testing.TestClient:
        app = create_app(load_config(write_config(db, **overrides), env={}), db.dsn)
        apps.append(app)
        return falcon.testing.TestClient(app)

    yield make
    for app in apps:
        app.pool.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_problem(result: falcon.testing.Result, status: int) -> dict[str, Any]:
    assert result.status_code == status, result.text
    assert result.headers["content-type"] == "application/problem+json"
    body = result.json
    assert {"type", "title", "detail"} <= set(body) and body["status"] == status
    return body


# --- auth ----------------------------------------------------------------------------------------


def test_token_create_prints_the_token_once_and_stores_only_its_hash(db, world, write_config, capsys) -> None:
    from dispatcher.cli.main import main

    world.workspace("acme")
    config = write_config(db)
    assert main(["-c", str(config), "token", "create", "--workspace", "acme",
                 "--scope", "webhooks:read,webhooks:write"]) == 0
    token = capsys.readouterr().out.strip()
    assert re.fullmatch(r"dsp_[A-Za-z0-9_-]{43}", token)
    rows = world.sql("SELECT token_sha256, workspace_id, scopes FROM api_tokens")
    assert rows == [(auth.hash_token(token), "acme", ["webhooks:read", "webhooks:write"])]
    assert token not in json.dumps(world.sql("SELECT row_to_json(t) FROM api_tokens t"), default=str)
    with pytest.raises(SystemExit) as bad_scope:
        main(["-c", str(config), "token", "create", "--workspace", "acme", "--scope", "admin"])
    assert bad_scope.value.code == 2
    with pytest.raises(SystemExit) as no_workspace:
        main(["-c", str(config), "token", "create", "--workspace", "nope"])
    assert no_workspace.value.code == 1


def test_missing_or_bad_token_is_401_and_missing_scope_is_403(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    ep = world.endpoint(ws)
    delivery = world.delivery(ws, ep, world.event(ws, "evt_1"), status="dead")
    read_only = world.token(ws, auth.READ)
    for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Basic dXNlcjpwYXNz"},
                    bearer("dsp_not-a-real-token"), bearer("x" * 5000), {"Authorization": "Bearer ünï"}):
        result = client.simulate_get("/v2/webhooks/deliveries", headers=headers)
        assert_problem(result, 401)
        assert result.headers["www-authenticate"] == "Bearer"
    # 401 comes before any look at the (malformed) id.
    assert_problem(client.simulate_get("/v2/webhooks/deliveries/not-a-number"), 401)
    assert client.simulate_get(f"/v2/webhooks/deliveries/{delivery}", headers=bearer(read_only)).status_code == 200
    forbidden = assert_problem(client.simulate_post(f"/v2/webhooks/deliveries/{delivery}/replay",
                                                    headers=bearer(read_only)), 403)
    assert "webhooks:write" in forbidden["detail"]
    assert_problem(client.simulate_post(f"/v2/webhooks/endpoints/{ep}/recover", headers=bearer(read_only),
                                        json={"since": "2026-01-01T00:00:00Z"}), 403)
    write_only = world.token(ws, auth.WRITE)
    assert_problem(client.simulate_get("/v2/webhooks/deliveries", headers=bearer(write_only)), 403)
    world.sql("UPDATE api_tokens SET revoked_at = now()")
    assert_problem(client.simulate_get("/v2/webhooks/deliveries", headers=bearer(read_only)), 401)
    assert world.count("replay_of IS NOT NULL") == 0


def test_other_workspaces_ids_are_404_as_if_they_did_not_exist(world, make_client) -> None:
    client = make_client()
    a, b = world.workspace("acme"), world.workspace("globex")
    ep_a = world.endpoint(a)
    event_a = world.event(a, "evt_acme")
    delivery_a = world.delivery(a, ep_a, event_a, status="dead")
    world.attempt(delivery_a, ep_a, 1, "http_5xx", 500)
    token_b = world.token(b)

    def same_as_missing(path: str, theirs_id: str, method: str = "GET", **kw: Any) -> None:
        theirs = assert_problem(client.simulate_request(method, path, headers=bearer(token_b), **kw), 404)
        missing_path = path.replace(theirs_id, "987654")
        missing = assert_problem(client.simulate_request(method, missing_path, headers=bearer(token_b), **kw), 404)
        # Word for word the answer for an id that exists nowhere, but for the id itself.
        assert theirs == {**missing, "detail": missing["detail"].replace("987654", theirs_id)}

    same_as_missing(f"/v2/webhooks/deliveries/{delivery_a}", str(delivery_a))
    same_as_missing(f"/v2/webhooks/deliveries/{delivery_a}/replay", str(delivery_a), "POST")
    same_as_missing(f"/v2/webhooks/endpoints/{ep_a}", str(ep_a))
    same_as_missing(f"/v2/webhooks/endpoints/{ep_a}/recover", str(ep_a), "POST",
                    json={"since": (datetime.now(UTC) - timedelta(days=1)).isoformat()})
    same_as_missing(f"/v2/events/{event_a}/deliveries", event_a)
    # Lists are filters, not lookups: another workspace's ids simply match nothing.
    for query in (f"event_id={event_a}", f"endpoint_id={ep_a}", ""):
        result = client.simulate_get("/v2/webhooks/deliveries", query_string=query, headers=bearer(token_b))
        assert result.status_code == 200 and result.json["data"] == []
    assert world.count() == 1
    assert world.sql("SELECT count(*) FROM api_replay_ledger") == [(0,)]


def test_an_event_id_used_by_two_workspaces_shows_each_only_its_own_event(world, make_client) -> None:
    """Event ids are unique per workspace (migration 0009): every lookup by id is a lookup
    by (workspace, id), so acme never sees globex's event, its type or its deliveries."""
    client = make_client()
    acme, globex = world.workspace("acme"), world.workspace("globex")
    ep_acme, ep_globex = world.endpoint(acme), world.endpoint(globex, "https://globex.example.test/")
    mine = world.delivery(acme, ep_acme, world.event(acme, "evt_shared", "job.created"), "dead")
    theirs = world.delivery(globex, ep_globex, world.event(globex, "evt_shared", "job.completed"), "dead")
    world.event(globex, "evt_only_globex")
    token = world.token(acme)
    history = client.simulate_get("/v2/events/evt_shared/deliveries", headers=bearer(token))
    assert [(d["id"], d["event_type"]) for d in history.json["data"]] == [(mine, "job.created")]
    listed = client.simulate_get("/v2/webhooks/deliveries", query_string="event_id=evt_shared", headers=bearer(token))
    assert [(d["id"], d["event_type"]) for d in listed.json["data"]] == [(mine, "job.created")]
    assert client.simulate_get(f"/v2/webhooks/deliveries/{mine}", headers=bearer(token)).json["event_type"] == \
        "job.created"
    assert_problem(client.simulate_get("/v2/events/evt_only_globex/deliveries", headers=bearer(token)), 404)
    replay = client.simulate_post(f"/v2/webhooks/deliveries/{mine}/replay", headers=bearer(token))
    assert replay.status_code == 202 and replay.json["event_type"] == "job.created"
    recover = client.simulate_post(f"/v2/webhooks/endpoints/{ep_acme}/recover", headers=bearer(token),
                                   json={"since": (datetime.now(UTC) - timedelta(days=1)).isoformat()})
    assert recover.status_code == 202, recover.text
    assert world.sql("SELECT workspace_id, count(*) FROM webhook_deliveries WHERE event_id = 'evt_shared' "
                     "GROUP BY workspace_id ORDER BY 1") == [("acme", 2), ("globex", 1)]
    assert world.sql("SELECT status FROM webhook_deliveries WHERE id = %s", (theirs,)) == [("dead",)]


# --- history -------------------------------------------------------------------------------------


def test_delivery_shows_every_attempt_and_no_claim_internals(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    ep = world.endpoint(ws)
    delivery = world.delivery(ws, ep, world.event(ws, "evt_1"), status="delivered", attempt=3)
    world.attempt(delivery, ep, 1, "timeout", None, error="TimeoutError: no response in 10s", duration_ms=10000)
    world.attempt(delivery, ep, 2, "http_5xx", 503, error="HTTP 503", excerpt="é" * 300)  # 600 bytes
    world.attempt(delivery, ep, 3, "delivered", 200, excerpt='{"ok":true}', duration_ms=87)
    body = client.simulate_get(f"/v2/webhooks/deliveries/{delivery}", headers=bearer(world.token(ws))).json
    assert body["id"] == delivery and body["event_id"] == "evt_1" and body["event_type"] == "job.completed"
    assert body["status"] == "delivered" and body["attempt"] == 3 and body["replay_of"] is None
    assert [(a["attempt"], a["result"], a["status_code"]) for a in body["attempts"]] == [
        (1, "timeout", None), (2, "http_5xx", 503), (3, "delivered", 200)]
    assert body["attempts"][0]["error"].startswith("TimeoutError") and body["attempts"][0]["duration_ms"] == 10000
    excerpt = body["attempts"][1]["response_excerpt"]
    assert excerpt == "é" * 128 and len(excerpt.encode()) == 256
    assert datetime.fromisoformat(body["attempts"][0]["started_at"]).tzinfo is not None
    text = json.dumps(body)
    assert "worker-7" not in text and "claim_token" not in text and "locked" not in text and "secret" not in text


def test_a_write_token_sees_the_payload_a_read_token_sees_it_masked(world, make_client) -> None:
    """Issue 27 item 10: one delivery carries the payload that was sent (the POST's ``data``),
    values masked for a read-only token; lists never carry it."""
    client = make_client()
    ws = world.workspace("acme")
    ep = world.endpoint(ws)
    payload = {"customer": {"email": "ada@acme.example", "card_last4": "4242"}, "items": [7, "x"],
               "paid": True, "note": None}
    world.sql("INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES ('evt_p', %s, 'order.paid', 1,"
              " %s)", (ws, json.dumps(payload)))
    delivery = world.delivery(ws, ep, "evt_p", "delivered", attempt=1)
    whole = client.simulate_get(f"/v2/webhooks/deliveries/{delivery}", headers=bearer(world.token(ws))).json
    assert whole["payload"] == payload and whole["payload_redacted"] is False
    masked = client.simulate_get(f"/v2/webhooks/deliveries/{delivery}", headers=bearer(world.token(ws, auth.READ)))
    assert masked.status_code == 200, masked.text
    assert masked.json["payload"] == {"customer": {"email": "***", "card_last4": "***"}, "items": ["***", "***"],
                                      "paid": "***", "note": None}
    assert masked.json["payload_redacted"] is True
    assert "4242" not in masked.text and "ada@" not in masked.text
    listed = client.simulate_get("/v2/webhooks/deliveries", headers=bearer(world.token(ws))).json["data"]
    assert [d["id"] for d in listed] == [delivery] and "payload" not in listed[0]
    world.sql("DELETE FROM events WHERE id = 'evt_p'")  # aged out: nothing left to show
    gone = client.simulate_get(f"/v2/webhooks/deliveries/{delivery}", headers=bearer(world.token(ws))).json
    assert gone["payload"] is None and gone["payload_redacted"] is False


def test_a_row_held_by_an_open_breaker_says_until_when(world, make_client) -> None:
    """Issue 27 item 11: a due row behind an open breaker is held until the window ends
    (``BreakerPolicy.holds``); a row due after the window, or behind a closed breaker, is not."""
    client = make_client()
    ws = world.workspace("acme")
    broken, fine = world.endpoint(ws), world.endpoint(ws, "https://two.example.test/")
    held = world.delivery(ws, broken, world.event(ws, "e1"), "pending", age=timedelta(minutes=5))
    later = world.delivery(ws, broken, world.event(ws, "e2"), "pending")
    world.sql("UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 hour' WHERE id = %s", (later,))
    free = world.delivery(ws, fine, "e1", "pending")
    world.sql("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until) "
              "VALUES (%s, 'open', 20, now() + interval '4 minutes')", (broken,))
    (open_until,) = world.sql("SELECT open_until FROM endpoint_state WHERE endpoint_id = %s", (broken,))[0]
    token = world.token(ws, auth.READ)
    rows = {d["id"]: d for d in client.simulate_get("/v2/webhooks/deliveries", headers=bearer(token)).json["data"]}
    assert rows[held]["breaker_hold"] == {"state": "open", "until": open_until.isoformat()}
    assert rows[later]["breaker_hold"] is None and rows[free]["breaker_hold"] is None
    one = client.simulate_get(f"/v2/webhooks/deliveries/{held}", headers=bearer(token)).json
    assert one["breaker_hold"] == rows[held]["breaker_hold"]
    event = client.simulate_get("/v2/events/e1/deliveries", headers=bearer(token)).json["data"]
    assert {d["id"]: d["breaker_hold"] is not None for d in event} == {held: True, free: False}
    world.sql("UPDATE endpoint_state SET open_until = now() - interval '1 second' WHERE endpoint_id = %s", (broken,))
    lapsed = client.simulate_get(f"/v2/webhooks/deliveries/{held}", headers=bearer(token)).json
    assert lapsed["breaker_hold"] is None  # the window lapsed: the next due row is the probe
    delivered = world.delivery(ws, broken, "e2", "dead")
    world.sql("UPDATE endpoint_state SET open_until = now() + interval '4 minutes' WHERE endpoint_id = %s", (broken,))
    assert client.simulate_get(f"/v2/webhooks/deliveries/{delivered}",
                               headers=bearer(token)).json["breaker_hold"] is None  # only pending rows wait


def test_list_filters_and_newest_first(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    ep1, ep2 = world.endpoint(ws), world.endpoint(ws, "https://two.example.test/")
    ids = {
        "old_dead": world.delivery(ws, ep1, world.event(ws, "e1"), "dead", age=timedelta(days=3)),
        "delivered": world.delivery(ws, ep1, world.event(ws, "e2"), "delivered", age=timedelta(hours=5)),
        "failed": world.delivery(ws, ep2, "e2", "failed", age=timedelta(hours=1)),
        "pending": world.delivery(ws, ep2, world.event(ws, "e3"), "pending"),
    }
    token = world.token(ws)

    def ids_for(query: str) -> list[int]:
        result = client.simulate_get("/v2/webhooks/deliveries", query_string=query, headers=bearer(token))
        assert result.status_code == 200, result.text
        return [d["id"] for d in result.json["data"]]

    assert ids_for("") == sorted(ids.values(), reverse=True)
    assert ids_for("status=dead") == [ids["old_dead"]]
    assert ids_for("event_id=e2") == [ids["failed"], ids["delivered"]]
    assert ids_for(f"endpoint_id={ep2}") == [ids["pending"], ids["failed"]]
    since = (datetime.now(UTC) - timedelta(hours=6)).isoformat()
    until = (datetime.now(UTC) - timedelta(minutes=30)).isoformat().replace("+00:00", "Z")
    assert ids_for(urlencode(since=since, until=until)) == [ids["failed"], ids["delivered"]]
    assert ids_for(urlencode(since=since, status="failed", endpoint_id=ep2)) == [ids["failed"]]


def urlencode(**params: Any) -> str:
    from urllib.parse import urlencode as encode

    return encode(params)


BAD_QUERIES = [
    "limit=0", "limit=101", "limit=abc", "limit=-1", "limit=1e3", "limit=", "limit=1&limit=2",
    "status=lost", "status=", "status=DEAD", "endpoint_id=abc", "endpoint_id=0", "endpoint_id=99999999999999999999",
    "since=yesterday", "since=2026-09-01", "since=2026-09-01T10:00:00", "since=2026-13-01T10:00:00Z",
    "until=2026-09-01T25:00:00Z", "until=0000-01-01T00:00:00Z", "since=2026-09-01T10:00:00%2B99:00",
    "cursor=", "cursor=abc", "cursor=%00%01", "cursor=" + "A" * 500, "cursor=ZDE6MA",  # d1:0
    "cursor=" + base64.urlsafe_b64encode(b"d1:99999999999999999999").decode().rstrip("="),
    "event_id=" + "e" * 256, "event_id=",
]


def test_bad_filters_and_cursors_are_400_problems(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    headers = bearer(world.token(ws))
    for query in BAD_QUERIES:
        result = client.simulate_get("/v2/webhooks/deliveries", query_string=query, headers=headers)
        assert result.status_code == 400, query
        assert_problem(result, 400)
    for query in ("limit=0", "cursor=abc", "limit=2&limit=3"):
        assert_problem(client.simulate_get("/v2/events/evt/deliveries", query_string=query, headers=headers), 400)


def test_malformed_ids_are_404_problems(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    headers = bearer(world.token(ws))
    raw_ids = ["abc", "-1", "0", "1.5", "99999999999999999999999", "9223372036854775808", "%201", "1e3", "0x10"]
    templates = (("GET", "/v2/webhooks/deliveries/{}"), ("POST", "/v2/webhooks/deliveries/{}/replay"),
                 ("GET", "/v2/webhooks/endpoints/{}"), ("POST", "/v2/webhooks/endpoints/{}/recover"))
    for raw_id, (method, template) in itertools.product(raw_ids, templates):
        result = client.simulate_request(method, template.format(raw_id), headers=headers,
                                         json={"since": "2026-09-01T00:00:00Z"})
        assert_problem(result, 404)


SEED_DAY = event_day_sql("'acme'", "'evt_seed'")


def test_pagination_is_stable_under_concurrent_inserts(world, make_client, db) -> None:
    client = make_client()
    ws = world.workspace("acme")
    ep = world.endpoint(ws)
    world.event(ws, "evt_seed")
    world.sql("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, event_day)"
              " SELECT %s, %s, 'evt_seed', 'h', (ARRAY['pending','delivered','dead'])[1 + n %% 3], " + SEED_DAY +
              " FROM generate_series(1, 230) n", (ws, ep))
    existing = [r[0] for r in world.sql("SELECT id FROM webhook_deliveries ORDER BY id DESC")]
    token = world.token(ws)
    stop = threading.Event()

    def insert_concurrently() -> None:
        # Another "producer" keeps adding rows while the client pages.
        conn = psycopg2.connect(db.dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            while not stop.is_set():
                cur.execute("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash,"
                            " event_day) VALUES (%s, %s, 'evt_seed', 'h', " + SEED_DAY + ")", (ws, ep))
                time.sleep(0.002)
        conn.close()

    writer = threading.Thread(target=insert_concurrently)
    writer.start()
    try:
        seen: list[int] = []
        cursor: str | None = None
        first_page_top: int | None = None
        while True:
            query = "limit=37" + (f"&cursor={cursor}" if cursor else "")
            page = client.simulate_get("/v2/webhooks/deliveries", query_string=query, headers=bearer(token)).json
            assert len(page["data"]) <= 37
            if first_page_top is None:
                first_page_top = page["data"][0]["id"]
            seen.extend(d["id"] for d in page["data"])
            # And a burst lands between every two pages, whatever the thread's pace.
            world.sql("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, event_day)"
                      " SELECT %s, %s, 'evt_seed', 'h', " + SEED_DAY + " FROM generate_series(1, 3)", (ws, ep))
            cursor = page["next_cursor"]
            if cursor is None:
                break
    finally:
        stop.set()
        writer.join()
    assert world.count() >= len(existing) + 3 * 7
    assert seen == sorted(set(seen), reverse=True), "strictly newest first, no duplicates"
    # Every row that existed before paging began is seen exactly once.
    assert [i for i in seen if i <= existing[0]] == existing
    assert all(i <= first_page_top for i in seen)


def test_event_history_includes_replays_with_attempts(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    ep1, ep2 = world.endpoint(ws), world.endpoint(ws, "https://two.example.test/")
    event = world.event(ws, "evt_history")
    d1 = world.delivery(ws, ep1, event, "delivered", attempt=1)
    world.attempt(d1, ep1, 1, "delivered", 200)
    d2 = world.delivery(ws, ep2, event, "dead", attempt=12, last_error="HTTP 500")
    world.attempt(d2, ep2, 1, "http_5xx", 500)
    world.delivery(ws, ep1, world.event(ws, "evt_other"), "delivered")
    token = world.token(ws)
    replay = client.simulate_post(f"/v2/webhooks/deliveries/{d2}/replay", headers=bearer(token))
    assert replay.status_code == 202
    body = client.simulate_get(f"/v2/events/{event}/deliveries", headers=bearer(token)).json
    assert body["event_id"] == event and body["next_cursor"] is None
    assert [(d["id"], d["endpoint_id"], d["replay_of"]) for d in body["data"]] == [
        (replay.json["id"], ep2, d2), (d2, ep2, None), (d1, ep1, None)]
    assert [len(d["attempts"]) for d in body["data"]] == [0, 1, 1]
    # An event nobody was subscribed to exists but has no deliveries.
    world.event(ws, "evt_quiet")
    quiet = client.simulate_get("/v2/events/evt_quiet/deliveries", headers=bearer(token))
    assert quiet.status_code == 200 and quiet.json["data"] == []
    assert_problem(client.simulate_get("/v2/events/evt_never/deliveries", headers=bearer(token)), 404)
    paged = client.simulate_get(f"/v2/events/{event}/deliveries", query_string="limit=2", headers=bearer(token)).json
    rest = client.simulate_get(f"/v2/events/{event}/deliveries", query_string=f"limit=2&cursor={paged['next_cursor']}",
                               headers=bearer(token)).json
    assert [d["id"] for d in paged["data"] + rest["data"]] == [d["id"] for d in body["data"]]


# --- replay --------------------------------------------------------------------------------------


def test_replay_creates_exactly_one_pending_row(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    ep = world.endpoint(ws)
    original = world.delivery(ws, ep, world.event(ws, "evt_1"), "dead", attempt=12, last_error="HTTP 500")
    before = world.count()
    result = client.simulate_post(f"/v2/webhooks/deliveries/{original}/replay", headers=bearer(world.token(ws)))
    assert result.status_code == 202, result.text
    new = result.json
    assert world.count() == before + 1
    assert result.headers["location"] == f"/v2/webhooks/deliveries/{new['id']}"
    assert (new["status"], new["attempt"], new["mode"], new["replay_of"], new["attempts"]) == (
        "pending", 0, "live", original, [])
    row = world.sql("SELECT n.workspace_id = o.workspace_id, n.endpoint_id = o.endpoint_id,"
                    " n.event_id = o.event_id, n.payload_hash = o.payload_hash, n.replay_of, n.status, n.attempt,"
                    " n.mode, n.next_attempt_at <= now(), n.locked_by, n.claim_token, n.last_error"
                    " FROM webhook_deliveries n JOIN webhook_deliveries o ON o.id = n.replay_of WHERE n.id = %s",
                    (new["id"],))
    assert row == [(True, True, True, True, original, "pending", 0, "live", True, None, None, None)]
    # The original keeps its history untouched.
    assert world.sql("SELECT status, attempt, last_error FROM webhook_deliveries WHERE id = %s", (original,)) == [
        ("dead", 12, "HTTP 500")]


def test_replay_to_an_inactive_or_deleted_endpoint_or_a_gone_event_is_409(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    token = world.token(ws)
    inactive = world.endpoint(ws, active=False)
    deleted = world.endpoint(ws)
    live = world.endpoint(ws)
    cases = {
        "inactive": world.delivery(ws, inactive, world.event(ws, "e1"), "failed"),
        "deleted": world.delivery(ws, deleted, world.event(ws, "e2"), "failed"),
        "no longer retained": world.delivery(ws, live, "evt_pruned", "dead"),
    }
    world.sql("DELETE FROM webhook_endpoints WHERE id = %s", (deleted,))
    for word, delivery in cases.items():
        body = assert_problem(client.simulate_post(f"/v2/webhooks/deliveries/{delivery}/replay",
                                                   headers=bearer(token)), 409)
        assert word in body["detail"]
    assert world.count() == 3
    assert world.sql("SELECT count(*) FROM api_replay_ledger") == [(0,)], "refused replays cost nothing"


def test_the_101st_replay_in_an_hour_gets_429_across_api_processes(world, make_client) -> None:
    first, second = make_client(), make_client()  # two processes, one database
    acme, globex = world.workspace("acme"), world.workspace("globex")
    ep = world.endpoint(acme)
    original = world.delivery(acme, ep, world.event(acme, "evt_1"), "dead")
    token = world.token(acme)
    for n in range(100):
        client = first if n % 2 else second
        assert client.simulate_post(f"/v2/webhooks/deliveries/{original}/replay",
                                    headers=bearer(token)).status_code == 202, n
    limited = first.simulate_post(f"/v2/webhooks/deliveries/{original}/replay", headers=bearer(token))
    body = assert_problem(limited, 429)
    assert body["type"].endswith(":rate-limited")
    assert 3590 <= int(limited.headers["retry-after"]) <= 3600
    assert world.count("replay_of = %s", (original,)) == 100
    # Another workspace has its own budget.
    ep_g = world.endpoint(globex)
    other = world.delivery(globex, ep_g, world.event(globex, "evt_g"), "dead")
    assert second.simulate_post(f"/v2/webhooks/deliveries/{other}/replay",
                                headers=bearer(world.token(globex))).status_code == 202
    # The window slides: once the oldest replay is 59 min old, one slot frees in about a minute.
    world.sql("UPDATE api_replay_ledger SET at = now() - interval '59 minutes'"
              " WHERE id = (SELECT min(id) FROM api_replay_ledger WHERE workspace_id = 'acme')")
    again = second.simulate_post(f"/v2/webhooks/deliveries/{original}/replay", headers=bearer(token))
    assert_problem(again, 429)
    assert 55 <= int(again.headers["retry-after"]) <= 61
    world.sql("UPDATE api_replay_ledger SET at = now() - interval '61 minutes'"
              " WHERE id = (SELECT min(id) FROM api_replay_ledger WHERE workspace_id = 'acme')")
    assert first.simulate_post(f"/v2/webhooks/deliveries/{original}/replay",
                               headers=bearer(token)).status_code == 202


# Express's 404 page echoes the request's path and query (finalhandler, HTML-escaped).
_SECRET_URL = "https://hooks.example.test/services/T0AB12CD/B0EF34GH/ripple9000?channel=ops-alerts&sig=Qz81kx"
_SECRET_PARTS = ("/services", "T0AB12CD", "B0EF34GH", "ripple9000", "ops-alerts", "Qz81kx")
_EXPRESS_404 = ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>Error</title>\n'
                '</head>\n<body>\n<pre>Cannot POST /services/T0AB12CD/B0EF34GH/ripple9000?channel=ops-alerts'
                '&amp;sig=Qz81kx</pre>\n</body>\n</html>\n')


def test_a_read_token_never_sees_the_endpoint_url_through_an_excerpt_or_error(world, make_client) -> None:
    """Issue 23 item 5: the URL a read token sees masked must not come back in clear in what the receiver
    echoed (the excerpt, cut at 256 bytes mid-path too) or in an error text; a write token sees it all."""
    client = make_client()
    ws = world.workspace("acme")
    ep = world.endpoint(ws, url=_SECRET_URL)
    echoed = "HTTP 404: Cannot POST /services/T0AB12CD/B0EF34GH/ripple9000?channel=ops-alerts&sig=Qz81kx"
    delivery = world.delivery(ws, ep, world.event(ws, "evt_1"), status="pending", attempt=3, last_error=echoed)
    world.attempt(delivery, ep, 1, "http_4xx", 404, error=echoed, excerpt=_EXPRESS_404)
    # The stored excerpt is cut at 256 bytes: here in the middle of the path.
    world.attempt(delivery, ep, 2, "http_4xx", 404, error="HTTP 404",
                  excerpt="x" * 214 + "Cannot POST /services/T0AB12CD/B0EF34")
    world.attempt(delivery, ep, 3, "http_4xx", 404, error="HTTP 404",
                  excerpt="Cannot POST %2Fservices%2FT0AB12CD%2FB0EF34GH%2Fripple9000")
    world.sql("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, last_error)"
              " VALUES (%s, 'closed', 3, %s)", (ep, echoed))
    read_token, write_token = world.token(ws, auth.READ), world.token(ws)
    paths = (f"/v2/webhooks/deliveries/{delivery}", "/v2/webhooks/deliveries", "/v2/events/evt_1/deliveries",
             f"/v2/webhooks/endpoints/{ep}", "/v2/webhooks/endpoints")
    for path in paths:
        shown = client.simulate_get(path, headers=bearer(read_token))
        assert shown.status_code == 200, shown.text
        for part in _SECRET_PARTS:
            assert part not in shown.text, (path, part, shown.text)
    detail = client.simulate_get(paths[0], headers=bearer(read_token)).json
    first = detail["attempts"][0]
    assert "Cannot POST ***" in first["response_excerpt"] and first["error"] == "HTTP 404: Cannot POST ***"
    assert detail["attempts"][1]["response_excerpt"].endswith("Cannot POST ***")
    assert detail["last_error"] == "HTTP 404: Cannot POST ***"
    whole = client.simulate_get(paths[0], headers=bearer(write_token)).json
    assert whole["attempts"][0]["error"] == whole["last_error"] == echoed
    assert whole["attempts"][0]["response_excerpt"] == _EXPRESS_404
    endpoint = client.simulate_get(paths[3], headers=bearer(write_token)).json
    assert endpoint["last_error"] == echoed


class _Express404(BaseHTTPRequestHandler):
    """Answers as Express's final handler does: 404 with the request's path and query in the page."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        self.rfile.read(int(self.headers["Content-Length"]))
        page = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>Error</title>\n'
                f'</head>\n<body>\n<pre>Cannot POST {html.escape(self.path)}</pre>\n</body>\n</html>\n').encode()
        self.send_response(404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_real_receiver_echoing_the_path_shows_a_read_token_no_part_of_it(db, world, make_client, write_config,
                                                                          tmp_path: Path) -> None:
    from dispatcher_devtools.kit import Dispatcher, produce, seed_workspace, wait_until

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Express404)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}" + _SECRET_URL.partition(".test")[2]
        seed_workspace(db.dsn, "ws", [url])
        config = write_config(db)
        produce(config, db.dsn, "ws", 1)
        with Dispatcher(config, tmp_path / "dispatcher.log"):
            wait_until(lambda: world.sql("SELECT count(*) FROM webhook_delivery_attempts")[0][0] >= 1,
                       message="the receiver's 404 to be recorded")
        (delivery,) = [r[0] for r in world.sql("SELECT id FROM webhook_deliveries")]
        stored = world.sql("SELECT response_excerpt FROM webhook_delivery_attempts")[0][0]
        assert "Cannot POST /services/T0AB12CD" in stored, "the receiver echoed the path into the excerpt"
        client = make_client()
        read = client.simulate_get(f"/v2/webhooks/deliveries/{delivery}", headers=bearer(world.token("ws", auth.READ)))
        assert read.status_code == 200 and "Cannot POST ***" in read.json["attempts"][0]["response_excerpt"]
        for part in _SECRET_PARTS:
            assert part not in read.text, (part, read.text)
        whole = client.simulate_get(f"/v2/webhooks/deliveries/{delivery}", headers=bearer(world.token("ws")))
        assert whole.json["attempts"][0]["response_excerpt"] == stored
    finally:
        server.shutdown()
        server.server_close()


class _Capture(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.captured.append((dict(self.headers), body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_replay_is_delivered_with_the_same_idempotency_key(db, world, make_client, write_config,
                                                             tmp_path: Path) -> None:
    from standardwebhooks import Webhook

    from dispatcher.signing import as_standard_secret
    from dispatcher_devtools.kit import SECRET, Dispatcher, produce, seed_workspace, wait_until

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    server.captured = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        seed_workspace(db.dsn, "ws", [f"http://127.0.0.1:{server.server_address[1]}/hook"])
        config = write_config(db)
        (event_id,) = produce(config, db.dsn, "ws", 1, payload={"job": "j-9"})
        client = make_client()
        token = world.token("ws")
        with Dispatcher(config, tmp_path / "dispatcher.log"):
            wait_until(lambda: world.count("status = 'delivered'") == 1, message="the first delivery")
            (original,) = [r[0] for r in world.sql("SELECT id FROM webhook_deliveries")]
            replay = client.simulate_post(f"/v2/webhooks/deliveries/{original}/replay", headers=bearer(token))
            assert replay.status_code == 202
            wait_until(lambda: world.count("status = 'delivered'") == 2, message="the replay's delivery")
        captured = server.captured  # type: ignore[attr-defined]
        assert len(captured) == 2
        verifier = Webhook(as_standard_secret(SECRET))
        for headers, body in captured:
            assert headers["Idempotency-Key"] == headers["webhook-id"] == event_id
            assert verifier.verify(body, {k.lower(): v for k, v in headers.items()})["id"] == event_id
            assert headers["X-Larkspur-Attempt"] == "1"
        first, second = (json.loads(body) for _, body in captured)
        assert first == second, "the same event payload"
        detail = client.simulate_get(f"/v2/webhooks/deliveries/{replay.json['id']}", headers=bearer(token)).json
        assert detail["status"] == "delivered" and [a["status_code"] for a in detail["attempts"]] == [200]
    finally:
        server.shutdown()
        server.server_close()


# --- recover -------------------------------------------------------------------------------------


def test_recover_requeues_each_failed_event_once_as_new_replay_rows(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    ep, other_ep = world.endpoint(ws), world.endpoint(ws, "https://other.example.test/")
    token = world.token(ws)
    hour = timedelta(hours=1)
    expected = {
        world.delivery(ws, ep, world.event(ws, "e_dead1"), "dead", age=2 * hour),
        world.delivery(ws, ep, world.event(ws, "e_dead2"), "dead", age=3 * hour),
        world.delivery(ws, ep, world.event(ws, "e_failed"), "failed", age=hour),
    }
    world.delivery(ws, ep, world.event(ws, "e_twice"), "dead", age=5 * hour)
    expected.add(world.delivery(ws, ep, "e_twice", "dead", age=4 * hour))  # the newest row of the event
    skipped = [
        world.delivery(ws, ep, world.event(ws, "e_old"), "dead", age=timedelta(days=3)),  # before since
        world.delivery(ws, ep, world.event(ws, "e_ok"), "delivered", age=hour),
        world.delivery(ws, ep, world.event(ws, "e_waiting"), "pending", age=hour),
        world.delivery(ws, other_ep, world.event(ws, "e_elsewhere"), "dead", age=hour),
        world.delivery(ws, ep, world.event(ws, "e_shadow"), "dead", age=hour, mode="shadow"),
    ]
    fixed = world.delivery(ws, ep, world.event(ws, "e_fixed"), "dead", age=2 * hour)
    world.delivery(ws, ep, "e_fixed", "delivered", replay_of=fixed)  # already replayed successfully
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    result = client.simulate_post(f"/v2/webhooks/endpoints/{ep}/recover", headers=bearer(token), json={"since": since})
    assert result.status_code == 202, result.text
    assert result.json["queued"] == 4 and result.json["replay_units"] == 1 and result.json["endpoint_id"] == ep
    new = world.sql("SELECT replay_of, status, attempt, mode, endpoint_id FROM webhook_deliveries"
                    " WHERE replay_of IS NOT NULL AND status = 'pending'")
    assert not {r[0] for r in new} & set(skipped)
    assert {r[0] for r in new} == expected
    assert {r[1:] for r in new} == {("pending", 0, "live", ep)}
    assert world.sql("SELECT sum(units) FROM api_replay_ledger") == [(1,)]
    # A second recover finds every event already pending again: nothing is queued twice.
    again = client.simulate_post(f"/v2/webhooks/endpoints/{ep}/recover", headers=bearer(token), json={"since": since})
    assert again.status_code == 202 and again.json["queued"] == 0 and again.json["replay_units"] == 0
    # until narrows the window (exclusive).
    world.sql("UPDATE webhook_deliveries SET status = 'dead' WHERE replay_of IS NOT NULL AND status = 'pending'")
    until = (datetime.now(UTC) - 2.5 * hour).isoformat()
    ranged = client.simulate_post(f"/v2/webhooks/endpoints/{ep}/recover", headers=bearer(token),
                                  json={"since": since, "until": until})
    assert ranged.status_code == 202 and ranged.json["queued"] == 2  # e_dead2 and e_twice


def test_recover_rejects_bad_bodies(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    ep = world.endpoint(ws)
    headers = bearer(world.token(ws))
    yesterday = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    cases: list[tuple[Any, int]] = [
        ({"since": "2020-01-01T00:00:00Z"}, 422),  # more than 30 days back
        ({"since": yesterday, "until": "2026-01-01T00:00:00Z"}, 422),  # until before since
        ({}, 400), ({"since": None}, 400), ({"since": 1693526400}, 400), ({"since": "last tuesday"}, 400),
        ({"since": "2026-09-01T00:00:00"}, 400), ({"since": yesterday, "extra": 1}, 400),
        ({"since": yesterday, "until": 5}, 400), ([], 400), ("since", 400), (None, 400),
    ]
    for body, status in cases:
        result = client.simulate_post(f"/v2/webhooks/endpoints/{ep}/recover", headers=headers, body=json.dumps(body))
        assert result.status_code == status, body
        assert_problem(result, status)


def test_recover_and_replay_bodies_are_bounded_and_must_be_json(world, make_client) -> None:
    client = make_client(api__max_body_bytes=1024)
    ws = world.workspace("acme")
    ep = world.endpoint(ws)
    delivery = world.delivery(ws, ep, world.event(ws, "e1"), "dead")
    headers = bearer(world.token(ws))
    path = f"/v2/webhooks/endpoints/{ep}/recover"
    assert_problem(client.simulate_post(path, headers=headers, body="x" * 2000), 413)
    assert_problem(client.simulate_post(f"/v2/webhooks/deliveries/{delivery}/replay", headers=headers,
                                        body="x" * 2000), 413)
    for raw in (b"", b"{", b'{"since": "2026-', b"\xff\xfe{}", b"[" * 500 + b"]" * 500, b"NaN"):
        assert_problem(client.simulate_post(path, headers=headers, body=raw), 400)
    inactive = world.endpoint(ws, active=False)
    body = assert_problem(client.simulate_post(f"/v2/webhooks/endpoints/{inactive}/recover", headers=headers,
                                               json={"since": datetime.now(UTC).isoformat()}), 409)
    assert "inactive" in body["detail"]


def test_recover_costs_one_replay_unit_per_100_rows_and_is_refused_whole(world, make_client) -> None:
    client = make_client(api__replays_per_hour=5)
    ws = world.workspace("acme")
    ep1, ep2, ep3 = world.endpoint(ws), world.endpoint(ws), world.endpoint(ws)
    token = world.token(ws)
    for ep, rows in ((ep1, 250), (ep2, 201), (ep3, 501)):
        world.sql("WITH ev AS (INSERT INTO events (id, workspace_id, type, sequence, payload)"
                  "  SELECT 'evt_' || %(ep)s || '_' || n, %(ws)s, 'job.created', %(ep)s * 10000 + n, '{}'"
                  "  FROM generate_series(1, %(rows)s) n RETURNING id)"
                  " INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status)"
                  " SELECT %(ws)s, %(ep)s, id, 'h', 'dead' FROM ev", {"ep": ep, "ws": ws, "rows": rows})
    since = {"since": (datetime.now(UTC) - timedelta(hours=1)).isoformat()}
    first = client.simulate_post(f"/v2/webhooks/endpoints/{ep1}/recover", headers=bearer(token), json=since)
    assert first.status_code == 202 and (first.json["queued"], first.json["replay_units"]) == (250, 3)
    # 201 rows need 3 units; only 2 are left: refused whole, nothing queued.
    refused = client.simulate_post(f"/v2/webhooks/endpoints/{ep2}/recover", headers=bearer(token), json=since)
    assert_problem(refused, 429)
    assert int(refused.headers["retry-after"]) > 3500
    assert world.count(f"endpoint_id = {ep2} AND status = 'pending'") == 0
    # 501 rows need 6 units: more than an hour's budget can ever hold.
    too_big = assert_problem(client.simulate_post(f"/v2/webhooks/endpoints/{ep3}/recover", headers=bearer(token),
                                                  json=since), 422)
    assert "until" in too_big["detail"]
    # A single replay still fits in what is left (2 units).
    one = world.sql("SELECT id FROM webhook_deliveries WHERE endpoint_id = %s LIMIT 1", (ep2,))[0][0]
    assert client.simulate_post(f"/v2/webhooks/deliveries/{one}/replay", headers=bearer(token)).status_code == 202
    assert world.sql("SELECT sum(units) FROM api_replay_ledger") == [(4,)]


# --- endpoint state ------------------------------------------------------------------------------


def test_endpoint_state_closed_breaker_and_backlog(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    ep = world.endpoint(ws, "https://hooks.example.test/a", types=("job.created", "job.completed"))
    world.delivery(ws, ep, world.event(ws, "e1"), "pending", age=timedelta(minutes=10))
    world.delivery(ws, ep, world.event(ws, "e2"), "pending", age=timedelta(minutes=2))
    world.delivery(ws, ep, world.event(ws, "e3"), "delivered", age=timedelta(hours=2))
    body = client.simulate_get(f"/v2/webhooks/endpoints/{ep}", headers=bearer(world.token(ws))).json
    assert body["url"] == "https://hooks.example.test/a" and body["active"] is True
    assert body["event_types"] == ["job.created", "job.completed"]
    # No endpoint_state row: the engine never saw a failure.
    assert body["breaker"] == {"state": "closed", "consecutive_failures": 0, "open_until": None, "opened_at": None}
    assert body["pending"]["count"] == 2
    assert 590 <= body["pending"]["oldest_age_seconds"] <= 660
    assert body["last_success_at"] is None and body["last_failure_at"] is None and body["last_error"] is None
    assert body["max_per_second"] is None  # no rate limit unless one is set
    world.sql("UPDATE webhook_endpoints SET max_per_second = 2.5 WHERE id = %s", (ep,))
    assert client.simulate_get(f"/v2/webhooks/endpoints/{ep}", headers=bearer(world.token(ws))).json[
        "max_per_second"] == 2.5


def test_endpoint_state_open_and_half_open_breaker(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    token = world.token(ws)
    ep = world.endpoint(ws)
    world.sql("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, opened_at,"
              " last_success_at, last_failure_at, last_error) VALUES (%s, 'open', 20, now() + interval '4 minutes',"
              " now() - interval '1 minute', now() - interval '2 hours', now() - interval '1 minute', 'HTTP 503')",
              (ep,))
    body = client.simulate_get(f"/v2/webhooks/endpoints/{ep}", headers=bearer(token)).json
    breaker = body["breaker"]
    assert breaker["state"] == "open" and breaker["consecutive_failures"] == 20
    assert timedelta(minutes=3) < datetime.fromisoformat(breaker["open_until"]) - datetime.now(UTC) \
        < timedelta(minutes=5)
    assert body["last_error"] == "HTTP 503"
    assert datetime.fromisoformat(body["last_success_at"]) < datetime.fromisoformat(body["last_failure_at"])
    assert body["pending"] == {"count": 0, "oldest_created_at": None, "oldest_age_seconds": None}
    # Past open_until the next delivery is the probe: half-open, whatever the row says.
    world.sql("UPDATE endpoint_state SET open_until = now() - interval '1 second'")
    assert client.simulate_get(f"/v2/webhooks/endpoints/{ep}",
                               headers=bearer(token)).json["breaker"]["state"] == "half_open"
    world.sql("UPDATE endpoint_state SET state = 'half_open', open_until = NULL")
    assert client.simulate_get(f"/v2/webhooks/endpoints/{ep}",
                               headers=bearer(token)).json["breaker"]["state"] == "half_open"
    world.sql("DELETE FROM webhook_endpoints WHERE id = %s", (ep,))
    assert_problem(client.simulate_get(f"/v2/webhooks/endpoints/{ep}", headers=bearer(token)), 404)


# --- failures and the contract -------------------------------------------------------------------


def test_database_down_is_503_problem_and_the_pool_reconnects(world, db, write_config, caplog) -> None:
    ws = world.workspace("acme")
    token = world.token(ws)
    down = create_app(load_config(write_config(db), env={}), "postgresql://postgres@127.0.0.1:1/nothing")
    client = falcon.testing.TestClient(down)
    for path in ("/healthz", "/v2/webhooks/deliveries"):
        body = assert_problem(client.simulate_get(path, headers=bearer(token)), 503)
        assert "127.0.0.1" not in body["detail"] and "Traceback" not in json.dumps(body)
    assert client.simulate_get("/healthz").headers["retry-after"] == "5"
    down.pool.close()

    app = create_app(load_config(write_config(db, api__pool_size=2), env={}), db.dsn)
    client = falcon.testing.TestClient(app)
    try:
        assert client.simulate_get("/v2/webhooks/deliveries", headers=bearer(token)).status_code == 200
        # The server drops every API connection (a restart, a failover).
        world.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                  " WHERE application_name = 'dispatcher-api' AND datname = current_database()")
        statuses = [client.simulate_get("/v2/webhooks/deliveries", headers=bearer(token)).status_code
                    for _ in range(3)]
        assert statuses[0] in (200, 503) and statuses[1:] == [200, 200]
    finally:
        app.pool.close()


def test_statement_timeout_is_503_not_500(world, db, make_client) -> None:
    client = make_client(api__statement_timeout="200ms")
    ws = world.workspace("acme")
    world.sql("INSERT INTO api_tokens (token_sha256, workspace_id, scopes) VALUES (%s, %s, %s)",
              (auth.hash_token("dsp_t"), ws, [auth.READ]))
    # Another session holds the outbox locked, so the read waits until its
    # statement timeout fires -- deterministically, whatever the machine's speed.
    blocker = db.connect()
    try:
        with blocker.cursor() as cur:
            cur.execute("LOCK TABLE webhook_deliveries IN ACCESS EXCLUSIVE MODE")
        statuses = {client.simulate_get("/v2/webhooks/deliveries", headers=bearer("dsp_t")).status_code
                    for _ in range(3)}
    finally:
        blocker.rollback()
        blocker.close()
    assert statuses == {503}


def test_unexpected_errors_are_logged_and_answered_with_a_problem(world, make_client, monkeypatch, caplog) -> None:
    from dispatcher.store import deliveries

    client = make_client()
    ws = world.workspace("acme")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(deliveries, "list_deliveries", broken)
    body = assert_problem(client.simulate_get("/v2/webhooks/deliveries", headers=bearer(world.token(ws))), 500)
    assert "a bug" not in json.dumps(body)
    assert any("a bug" in (r.exc_text or "") or (r.exc_info and "a bug" in str(r.exc_info[1]))
               for r in caplog.records)


def _openapi() -> dict[str, Any]:
    return json.loads((REPO / "dispatcher" / "api" / "openapi.json").read_text())


# The app opens connections lazily, so the contract tests need no database.
NO_DATABASE = SimpleNamespace(dsn="postgresql://postgres@127.0.0.1:1/none")


def test_every_route_is_in_the_openapi_document_and_vice_versa(write_config) -> None:
    app = create_app(load_config(write_config(NO_DATABASE), env={}), NO_DATABASE.dsn)
    served = {(route.path, method.method.lower())
              for route in falcon.inspect.inspect_routes(app) for method in route.methods if not method.internal}
    documented = {(path, method) for path, item in _openapi()["paths"].items() for method in item}
    assert served == documented
    result = falcon.testing.TestClient(app).simulate_get("/openapi.json")
    assert result.status_code == 200 and result.json == _openapi()


def test_console_is_one_self_contained_page(write_config) -> None:
    app = create_app(load_config(write_config(NO_DATABASE), env={}), NO_DATABASE.dsn)
    result = falcon.testing.TestClient(app).simulate_get("/console")
    assert result.status_code == 200 and result.headers["content-type"].startswith("text/html")
    html = result.text
    assert "<script src" not in html and "@import" not in html
    assert re.findall(r"<link[^>]*>", html) == ['<link rel="icon" href="data:,">']  # no favicon request
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    csp = result.headers["content-security-policy"]
    assert "'unsafe-inline'" not in csp and "script-src 'sha256-" in csp and "connect-src 'self'" in csp


# --- the real server process ---------------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    # A DISPATCHER_DATABASE_DSN in the caller's environment would override the test's config.
    return {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}


def _start_api(config: Path) -> tuple[subprocess.Popen[str], int, list[str]]:
    """``dispatcher -c CONFIG api`` (which execs dispatcher.runtime.api_main); returns the process and its port."""
    process = subprocess.Popen([sys.executable, "-m", "dispatcher.cli", "-c", str(config), "api"], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_clean_env())
    lines: list[str] = []
    port: list[int] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            match = re.search(r"API listening on http://127\.0\.0\.1:(\d+)", line)
            if match:
                port.append(int(match.group(1)))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(30) or not port:
        process.kill()
        raise AssertionError("the API did not start:\n" + "".join(lines))
    return process, port[0], lines


def _http(port: int, path: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=bearer(token) if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_cli_serves_the_api_under_gevent_and_stops_cleanly_on_sigterm(world, db, write_config) -> None:
    ws = world.workspace("acme")
    ep = world.endpoint(ws)
    world.delivery(ws, ep, world.event(ws, "evt_1"), "dead")
    token = world.token(ws)
    process, port, lines = _start_api(write_config(db, api__listen="127.0.0.1:0"))
    try:
        assert _http(port, "/healthz") == (200, {"status": "ok"})
        status, body = _http(port, "/v2/webhooks/deliveries", token)
        assert status == 200 and [d["event_id"] for d in body["data"]] == ["evt_1"]
        status, body = _http(port, "/v2/webhooks/deliveries")
        assert status == 401 and body["type"].endswith(":unauthorized")
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert any("API stopped" in line for line in lines)


def test_serve_main_exits_3_when_the_database_is_unreachable(write_config) -> None:
    config = write_config(NO_DATABASE, database={"dsn": NO_DATABASE.dsn, "connect_timeout": "1s"})
    result = subprocess.run([sys.executable, "-m", "dispatcher.runtime.api_main", "-c", str(config)], cwd=REPO,
                            capture_output=True, text=True, timeout=30, env=_clean_env())
    assert result.returncode == 3, result.stderr
    assert "cannot connect" in result.stderr and "Traceback" not in result.stderr


def test_serve_main_refuses_an_unmigrated_database(empty_db, write_config) -> None:
    result = subprocess.run([sys.executable, "-m", "dispatcher.runtime.api_main", "-c", str(write_config(empty_db))],
                            cwd=REPO, capture_output=True, text=True, timeout=30, env=_clean_env())
    assert result.returncode == 6, result.stderr
    assert "migrate" in result.stderr and "Traceback" not in result.stderr
