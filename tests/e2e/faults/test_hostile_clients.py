"""Hostile API clients (issue 13 item 1): slowloris, slow uploads, loops of
refused recovers, bogus tokens and health probes.

The server tests run the real API process (``dispatcher.runtime.api_main`` under gevent).
Every wait is bounded by a client socket timeout; nothing asserts on a
measured duration.
"""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import falcon.testing
import psutil
import pytest

from dispatcher.api.app import create_app
from dispatcher.config import load_config
from dispatcher_devtools.kit import query, wait_until
from tests.support.faults import ApiServer, create_token

pytestmark = pytest.mark.timeout(120)

HOSTILE = 1100  # more than the 1,000 greenlets the server used to have in all


def _raise_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.fail(f"RLIMIT_NOFILE hard limit {hard} is below the {needed} descriptors this test needs")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def _get(port: int, path: str, token: str | None = None, timeout: float = 2.0) -> tuple[int, Any]:
    """One GET on a fresh connection; the socket timeout bounds the wait for the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode())
        return _read_response(sock)


def _read_response(sock: socket.socket) -> tuple[int, Any]:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body.strip() else None


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (EOF or reset); False if the socket timeout passes first."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture
def api_config(db, write_config):  # type: ignore[no-untyped-def]
    def make(database: dict[str, Any] | None = None, **api: Any) -> Path:
        overrides: dict[str, Any] = {"database__" + key: value for key, value in (database or {}).items()}
        return write_config(db, api={"listen": "127.0.0.1:0", **api}, **overrides)

    return make


def test_slowloris_does_not_stop_healthz_and_idle_connections_are_closed(api_config) -> None:
    _raise_nofile(HOSTILE + 1024)
    config = api_config(idle_timeout="3s", read_timeout="3s", keepalive_timeout="3s")
    held: list[socket.socket] = []
    with ApiServer(config) as api:
        try:
            for i in range(HOSTILE):
                sock = _connect(api.port)
                if i % 2:  # half of them send half a request head, the others nothing at all
                    sock.sendall(b"POST /v2/webhooks/endpoints/1/recover HTTP/1.1\r\nHost: x\r\nContent-")
                held.append(sock)
            status, body = _get(api.port, "/healthz", timeout=2.0)
            assert (status, body) == (200, {"status": "ok"})
            # Every hostile connection is closed by the server within its timeout (3 s)
            # plus a margin; the socket timeout bounds the wait.
            give_up = time.monotonic() + 3.0 + 10.0
            still_open = 0
            for sock in held:
                sock.settimeout(max(0.05, give_up - time.monotonic()))
                still_open += not _closed_by_server(sock)
            assert still_open == 0
            # ...and the server still serves.
            assert _get(api.port, "/healthz", timeout=2.0)[0] == 200
        finally:
            for sock in held:
                sock.close()


def _accepted(api: ApiServer, socks: list[socket.socket]) -> bool:
    """The API process holds the server end of every one of ``socks``: it accepted them, and
    reads them from then on (a connection still in the listen backlog is in no process)."""
    assert api.process is not None
    server = psutil.Process(api.process.pid)
    ends = {(c.raddr.ip, c.raddr.port) for p in (server, *server.children(recursive=True))
            for c in p.net_connections("tcp") if c.raddr}
    return {sock.getsockname()[:2] for sock in socks} <= ends


def _seed_dead(db: Any, ws: str, endpoint: int, rows: int, tag: str) -> None:
    query(db.dsn, "WITH ev AS (INSERT INTO events (id, workspace_id, type, sequence, payload)"
                  "  SELECT 'evt_' || %(tag)s || '_' || n, %(ws)s, 'job.created', n, '{}'"
                  "  FROM generate_series(1, %(rows)s) n RETURNING id)"
                  " INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status)"
                  " SELECT %(ws)s, %(ep)s, id, 'h', 'dead' FROM ev",
          {"ws": ws, "ep": endpoint, "rows": rows, "tag": tag})


def _workspace(db: Any, ws: str) -> int:
    query(db.dsn, "INSERT INTO workspaces (id, secret) VALUES (%s, 'whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=')", (ws,))
    return int(query(db.dsn, "INSERT INTO webhook_endpoints (workspace_id, url) VALUES (%s, %s) RETURNING id",
                     (ws, "https://hooks.example.test/in"))[0][0])


def test_slow_recover_uploads_do_not_starve_other_workspaces(db, api_config) -> None:
    slow_ep = _workspace(db, "slow")
    _workspace(db, "other")
    _seed_dead(db, "slow", slow_ep, 3, "slow")
    # Two database connections, and a pool wait short enough that a starved request shows as 503.
    # The 8 uploads end at once: a cap of requests in flight below 8 would refuse some with 429
    # (tests/integration/test_api_in_flight.py); this test is about the wait, not the cap.
    config = api_config(pool_size=2, requests_in_flight_per_workspace=8, database={"connect_timeout": "1s"})
    slow_token, other_token = create_token(config, "slow"), create_token(config, "other")
    body = json.dumps({"since": (datetime.now(UTC) - timedelta(days=1)).isoformat()}).encode()
    uploads: list[socket.socket] = []
    with ApiServer(config) as api:
        try:
            for _ in range(8):  # eight uploads that stop half way through their body
                sock = socket.create_connection(("127.0.0.1", api.port), timeout=10)
                sock.sendall(f"POST /v2/webhooks/endpoints/{slow_ep}/recover HTTP/1.1\r\nHost: x\r\n"
                             f"Authorization: Bearer {slow_token}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:5])
                uploads.append(sock)
            wait_until(lambda: _accepted(api, uploads), message="the API to accept the 8 uploads")
            for _ in range(3):
                assert _get(api.port, "/v2/webhooks/deliveries", other_token, timeout=10.0)[0] == 200
            # The uploads finish and are served: nothing was lost to the wait.
            for sock in uploads:
                sock.sendall(body[5:])
            statuses = [_read_response(sock)[0] for sock in uploads]
            assert sorted(statuses) == [202] * 8
        finally:
            for sock in uploads:
                sock.close()
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'") == [(3,)]


# --- refused recovers cost nothing -----------------------------------------------------------------


@pytest.fixture
def client_for(db, write_config) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    apps = []

    def make(**api: Any) -> falcon.testing.TestClient:
        app = create_app(load_config(write_config(db, api=api), env={}), db.dsn)
        apps.append(app)
        return falcon.testing.TestClient(app)

    yield make
    for app in apps:
        app.pool.close()


def _token(config_db: Any, ws: str) -> str:
    from dispatcher.api import auth

    conn = config_db.connect()
    try:
        return auth.create_token(conn, ws, [auth.READ, auth.WRITE])
    finally:
        conn.close()


def _ids_used(db: Any) -> int:
    # Sequences are not transactional: a row inserted and rolled back still used its id.
    return int(query(db.dsn, "SELECT last_value FROM webhook_deliveries_id_seq")[0][0])


def test_refused_recovers_write_nothing(db, client_for) -> None:
    ep = _workspace(db, "acme")
    _seed_dead(db, "acme", ep, 150, "a")
    token = _token(db, "acme")
    since = {"since": (datetime.now(UTC) - timedelta(days=1)).isoformat()}
    path, headers = f"/v2/webhooks/endpoints/{ep}/recover", {"Authorization": f"Bearer {token}"}
    # 150 rows need 2 units: more than a 1-unit hour can ever hold (422).
    client = client_for(replays_per_hour=1)
    before = _ids_used(db)
    for _ in range(5):
        assert client.simulate_post(path, headers=headers, json=since).status_code == 422
    assert _ids_used(db) == before
    # The budget is spent elsewhere first: refused with 429, again without a write.
    client = client_for(replays_per_hour=2)
    one = query(db.dsn, "SELECT id FROM webhook_deliveries LIMIT 1")[0][0]
    assert client.simulate_post(f"/v2/webhooks/deliveries/{one}/replay", headers=headers).status_code == 202
    before = _ids_used(db)
    for _ in range(5):
        assert client.simulate_post(path, headers=headers, json=since).status_code == 429
    assert _ids_used(db) == before
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'") == [(1,)]


def test_recover_is_capped_region_wide(db, client_for) -> None:
    first, second = _workspace(db, "first"), _workspace(db, "second")
    _seed_dead(db, "first", first, 150, "f")
    _seed_dead(db, "second", second, 50, "s")
    since = {"since": (datetime.now(UTC) - timedelta(days=1)).isoformat()}
    client = client_for(replays_per_hour=100, region_replays_per_hour=2)
    ok = client.simulate_post(f"/v2/webhooks/endpoints/{first}/recover",
                              headers={"Authorization": f"Bearer {_token(db, 'first')}"}, json=since)
    assert ok.status_code == 202 and ok.json["replay_units"] == 2
    before = _ids_used(db)
    refused = client.simulate_post(f"/v2/webhooks/endpoints/{second}/recover",
                                   headers={"Authorization": f"Bearer {_token(db, 'second')}"}, json=since)
    assert refused.status_code == 429, refused.json
    assert "region" in refused.json["detail"] and int(refused.headers["retry-after"]) > 0
    assert _ids_used(db) == before


# --- cheap work for bogus requests -----------------------------------------------------------------


def test_healthz_and_bogus_tokens_do_not_cost_a_database_round_trip_each(db, write_config) -> None:
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    try:
        client = falcon.testing.TestClient(app)
        for _ in range(20):
            assert client.simulate_get("/healthz").status_code == 200
        assert app.pool.lent <= 2
        lent = app.pool.lent
        for _ in range(20):
            result = client.simulate_get("/v2/webhooks/deliveries", headers={"Authorization": "Bearer dsp_bogus"})
            assert result.status_code == 401
        assert app.pool.lent - lent <= 1
        lent = app.pool.lent
        for garbage in ("not a token", "dsp_\u00e9t\u00e9", "dsp_a.b", "x" * 300):
            result = client.simulate_get("/v2/webhooks/deliveries", headers={"Authorization": f"Bearer {garbage}"})
            assert result.status_code == 401
        assert app.pool.lent == lent
    finally:
        app.pool.close()
