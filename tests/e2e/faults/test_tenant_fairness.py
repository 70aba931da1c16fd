"""Issue 23 item 2: one tenant asking for its largest answers does not take the API from another.

Before the bounds, one workspace's 5,000 inactive endpoints made a stats answer of
56 MB: the API process grew from 58 MB to 358 MB and every tenant's requests waited.
Here a workspace owns as many endpoints as it may (100, migration 0018), each with
history in every bucket of the longest stats window, and 8 clients ask in a loop for
its largest pages (stats at its largest limit, every list at its largest page) from
a real API process, while another workspace's ordinary requests and /healthz run.

Nothing asserts on a duration: the other tenant's every request must be answered 200
within a generous client timeout (30 s; a pool starved for 5 s answers 503), the storm
gets 200 or 429 (its workspace's cap of requests in flight), never a 5xx, every
answer of the storm stays under a byte bound, and the API process's memory grows by
less than a stated bound while the storm lasts.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dispatcher_devtools.kit import query, wait_until
from dispatcher_devtools.kit.runner import process_tree
from dispatcher_devtools.kit.tenants import SECRET, Storm, get, largest_paths, seed_hoarder
from tests.support.faults import ApiServer, create_token

pytestmark = pytest.mark.timeout(240)

MAX_ENDPOINTS = 100                # what a workspace may own, inactive ones included (migration 0018)
MAX_STATS_LIMIT = 25               # the largest stats page (dispatcher.api.params.MAX_STATS_LIMIT)
LARGEST_ANSWER = 512 * 1024        # bytes: any answer the storm gets (the largest stats page is about 300 KB)
RSS_GROWTH = 100 * 2**20           # bytes the API process may grow by during the storm (the issue saw +300 MB)
STORM_CLIENTS = 8
NEIGHBOUR_ROUNDS = 5
CLIENT_TIMEOUT = 30.0              # seconds a neighbour's request may take before it counts as unanswered


def _neighbour(dsn: str) -> int:
    """Workspace ``neighbour``: one active endpoint with one delivered row."""
    query(dsn, "INSERT INTO workspaces (id, secret) VALUES ('neighbour', %s)", (SECRET,))
    (endpoint,), = query(dsn, "INSERT INTO webhook_endpoints (workspace_id, url) VALUES ('neighbour',"
                              " 'https://hooks.example.test/n') RETURNING id")
    query(dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload)"
               " VALUES ('evt_n', 'neighbour', 'job.created', 1, '{}')")
    query(dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, event_day)"
               " SELECT 'neighbour', %s, id, 'h', 'delivered', day FROM events"
               " WHERE workspace_id = 'neighbour' AND id = 'evt_n'", (endpoint,))
    return int(endpoint)


class PeakRss:
    """The API process tree's largest resident size, sampled until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> int:
        return sum(p.memory_info().rss for p in process_tree(self.pid))

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def api_config(db: Any, write_config: Any) -> Path:
    return write_config(db, api={"listen": "127.0.0.1:0"})  # type: ignore[no-any-return]


def test_another_tenant_is_answered_while_one_asks_for_its_largest_answers(db: Any, api_config: Path) -> None:
    seed_hoarder(db.dsn, "hoarder", MAX_ENDPOINTS)
    endpoint = _neighbour(db.dsn)
    hoarder, neighbour = create_token(api_config, "hoarder", "webhooks:read"), create_token(api_config, "neighbour")
    ordinary = ["/v2/webhooks/endpoints", f"/v2/webhooks/endpoints/{endpoint}", "/v2/webhooks/deliveries",
                "/v2/webhooks/endpoints/stats", "/v2/events/evt_n/deliveries"]
    answers = []
    with ApiServer(api_config) as api:
        assert api.process is not None
        # The neighbour's routes are warm before the storm: what grows after is the storm's.
        warm = [get(api.port, path, neighbour) for path in ordinary] + [get(api.port, "/healthz")]
        assert [a.status for a in warm] == [200] * len(warm), warm
        with PeakRss(api.process.pid) as rss, Storm(api.port, hoarder, largest_paths(MAX_STATS_LIMIT),
                                                    clients=STORM_CLIENTS) as storm:
            before = rss.now()
            # The storm is under way: every client has had at least one of its answers.
            wait_until(lambda: len(storm.answers) >= STORM_CLIENTS, timeout=120,
                       message="the storm's first answers")
            for _ in range(NEIGHBOUR_ROUNDS):
                answers += [get(api.port, "/healthz", timeout=CLIENT_TIMEOUT)]
                answers += [get(api.port, path, neighbour, timeout=CLIENT_TIMEOUT) for path in ordinary]
    unanswered = [a for a in answers if a.status != 200]
    assert unanswered == [], unanswered
    storm_answers = list(storm.answers)
    # Past its cap of requests in flight (api.requests_in_flight_per_workspace) the storm is refused
    # with 429; it is never answered with a 5xx, and some of its largest pages are served.
    assert storm_answers and [a for a in storm_answers if a.status not in (200, 429)] == []
    served = [a for a in storm_answers if a.status == 200]
    assert {a.path.split("?")[0] for a in served} >= {"/v2/webhooks/endpoints/stats"}
    largest = max(storm_answers, key=lambda a: a.size)
    assert largest.size < LARGEST_ANSWER, largest
    assert rss.peak - before < RSS_GROWTH, f"the API grew from {before >> 20} MB to {rss.peak >> 20} MB"
