"""API history reads from a streaming standby (issue 14 item 4, ``api.read_dsn``).

One primary and one standby (``pg_basebackup -R``) for the module.  Replay on
the standby is paused (``pg_wal_replay_pause()``) to make its lag visible: what
the primary has and the standby has not yet applied shows which server a
route read.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import psycopg2
import pytest

from dispatcher.api import auth
from dispatcher.api.app import DispatcherApp, create_app
from dispatcher.config import load_config
from dispatcher_devtools.kit import (
    ReplicationPair,
    config_for_test,
    produce,
    query,
    seed_workspace,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.timeout(120)]

Api = tuple[DispatcherApp, falcon.testing.TestClient, str, str]  # app, client, token, workspace
_workspaces = itertools.count()


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicationPair]:
    with ReplicationPair(synchronous=False) as started:
        yield started


@pytest.fixture
def api(pair: ReplicationPair, tmp_path: Path) -> Iterator[Api]:
    """An in-process API on the primary, reading history from the standby; a read+write token."""
    workspace = f"ws{next(_workspaces)}"  # the module shares one database: each test its own workspace
    seed_workspace(pair.primary.dsn(), workspace, ["http://127.0.0.1:9/a"])
    path = write_config(tmp_path / "config.yaml", config_for_test(pair.primary.dsn(),
                                                                  api={"read_dsn": pair.standby.dsn()}))
    produce(path, pair.primary.dsn(), workspace, 3)
    conn = psycopg2.connect(pair.primary.dsn())
    try:
        token = auth.create_token(conn, workspace, [auth.READ, auth.WRITE])
    finally:
        conn.close()
    pair.wait_replayed()
    app = create_app(load_config(path, env={}), pair.primary.dsn())
    try:
        yield app, falcon.testing.TestClient(app), token, workspace
    finally:
        app.close()


def _get(client: falcon.testing.TestClient, path: str, token: str) -> Any:
    result = client.simulate_get(path, headers={"Authorization": f"Bearer {token}"})
    return result.status_code, result.json


def test_history_reads_come_from_the_standby_and_a_replay_is_written_on_the_primary(
        pair: ReplicationPair, api: Api) -> None:
    _, client, token, _ = api
    status, listed = _get(client, "/v2/webhooks/deliveries", token)
    assert status == 200 and len(listed["data"]) == 3
    source = listed["data"][0]
    with pair.replay_paused():
        replay = client.simulate_post(f"/v2/webhooks/deliveries/{source['id']}/replay",
                                      headers={"Authorization": f"Bearer {token}"})
        assert replay.status_code == 202, replay.text
        replayed = replay.json["id"]
        # Written on the primary ...
        assert query(pair.primary.dsn(), "SELECT replay_of FROM webhook_deliveries WHERE id = %s",
                     (replayed,)) == [(source["id"],)]
        # ... and not yet visible to any history read: they run on the paused standby.
        assert _get(client, f"/v2/webhooks/deliveries/{replayed}", token)[0] == 404
        assert [row["id"] for row in _get(client, "/v2/webhooks/deliveries", token)[1]["data"]] == \
            [row["id"] for row in listed["data"]]
        status, history = _get(client, f"/v2/events/{source['event_id']}/deliveries", token)
        assert status == 200 and [row["id"] for row in history["data"]] == [source["id"]]
        status, endpoint = _get(client, f"/v2/webhooks/endpoints/{source['endpoint_id']}", token)
        assert status == 200 and endpoint["pending"]["count"] == 3, "the replay is not counted yet"
        status, endpoints = _get(client, "/v2/webhooks/endpoints", token)
        assert status == 200 and [e["pending"]["count"] for e in endpoints["data"]] == [3]
        status, audit = _get(client, "/v2/webhooks/audit", token)
        assert status == 200 and audit["data"] == [], "the replay's audit entry is not there yet"
    pair.wait_replayed()
    status, shown = _get(client, f"/v2/webhooks/deliveries/{replayed}", token)
    assert status == 200 and shown["replay_of"] == source["id"]
    status, history = _get(client, f"/v2/events/{source['event_id']}/deliveries", token)
    assert {row["id"] for row in history["data"]} == {source["id"], replayed}
    status, audit = _get(client, "/v2/webhooks/audit", token)
    assert status == 200 and [entry["action"] for entry in audit["data"]] == ["delivery.replay"]


def test_tokens_are_checked_on_the_primary_whatever_the_standby_lag(
        pair: ReplicationPair, api: Api) -> None:
    _, client, token, workspace = api
    assert _get(client, "/v2/webhooks/deliveries", token)[0] == 200
    with pair.replay_paused():
        conn = psycopg2.connect(pair.primary.dsn())
        try:
            fresh = auth.create_token(conn, workspace, [auth.READ])
        finally:
            conn.close()
        # Revoked as docs/api.md says; the standby still shows it valid, and lacks the new one.
        query(pair.primary.dsn(), "UPDATE api_tokens SET revoked_at = now() WHERE token_sha256 = %s",
              (auth.hash_token(token),))
        assert query(pair.standby.dsn(), "SELECT revoked_at IS NULL FROM api_tokens WHERE token_sha256 = %s",
                     (auth.hash_token(token),)) == [(True,)]
        assert _get(client, "/v2/webhooks/deliveries", token)[0] == 401
        status, listed = _get(client, "/v2/webhooks/deliveries", fresh)
        assert status == 200 and len(listed["data"]) == 3


def test_reads_fall_back_to_the_primary_while_the_standby_is_down(
        pair: ReplicationPair, api: Api,
        caplog: pytest.LogCaptureFixture) -> None:
    app, client, token, workspace = api
    assert _get(client, "/v2/webhooks/deliveries", token)[0] == 200  # a pooled standby connection, now idle
    assert app.reads is not None
    standby_reads = app.reads.standby.lent
    pair.standby.stop("fast")
    try:
        # Written while the standby is down: only the primary can show it.
        source = query(pair.primary.dsn(), "SELECT min(id) FROM webhook_deliveries WHERE workspace_id = %s",
                       (workspace,))[0][0]
        replay = client.simulate_post(f"/v2/webhooks/deliveries/{source}/replay",
                                      headers={"Authorization": f"Bearer {token}"})
        assert replay.status_code == 202, replay.text
        with caplog.at_level(logging.WARNING, logger="dispatcher.api.pool"):
            for _ in range(3):
                status, shown = _get(client, f"/v2/webhooks/deliveries/{replay.json['id']}", token)
                assert status == 200 and shown["replay_of"] == source
        warnings = [r.getMessage() for r in caplog.records if "read_standby_down" in r.getMessage()]
        assert len(warnings) == 1, warnings  # once per retry period, not once per request
        assert app.reads.standby.lent == standby_reads + 1, "after one failure reads went straight to the primary"
    finally:
        pair.standby.start()
        pair.wait_streaming()

    def back_on_the_standby() -> bool:
        assert _get(client, "/v2/webhooks/deliveries", token)[0] == 200
        return app.reads is not None and app.reads.standby.lent > standby_reads + 1

    # Once the retry period (5 s) is over, reads go to the standby again.
    wait_until(back_on_the_standby, timeout=20, interval=0.5, message="reads to return to the standby")
