"""One workspace's requests in flight are capped per API process (issue 23 item 2):
past ``api.requests_in_flight_per_workspace`` a request gets 429 at once, while
another workspace's request is still served.

Requests are held in flight deterministically: the store function behind
``GET /v2/webhooks/deliveries`` is wrapped, inside this test process, to wait
on an event the test sets.  Nothing waits on a clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import falcon.testing
import pytest

from dispatcher.api import auth
from dispatcher.store import deliveries as delivery_store
from tests.integration import test_api
from tests.integration.test_api import ClientFactory, World, assert_problem, bearer

CAP = 2
world = test_api.world
make_client = test_api.make_client


class Gate:
    """Holds workspace ``held``'s delivery lists until ``release``; counts the ones inside."""

    def __init__(self, held: str) -> None:
        self.held = held
        self.inside = 0
        self.changed = threading.Condition()
        self.open = threading.Event()
        self.real = delivery_store.list_deliveries

    def list_deliveries(self, conn: Any, workspace_id: str, *args: Any, **kwargs: Any) -> Any:
        if workspace_id == self.held:
            with self.changed:
                self.inside += 1
                self.changed.notify_all()
            assert self.open.wait(60), "the test never released the held requests"
        return self.real(conn, workspace_id, *args, **kwargs)

    def wait_inside(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.inside >= count, timeout=60), f"{self.inside} inside"


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate("storm")
    monkeypatch.setattr(delivery_store, "list_deliveries", g.list_deliveries)
    yield g
    g.open.set()


def _list(client: falcon.testing.TestClient, token: str) -> falcon.testing.Result:
    return client.simulate_get("/v2/webhooks/deliveries", headers=bearer(token))


def test_a_workspace_past_its_cap_gets_429_while_another_is_served(world: World, make_client: ClientFactory,
                                                                   gate: Gate) -> None:
    client = make_client(api={"requests_in_flight_per_workspace": CAP})
    world.workspace("storm")
    world.workspace("calm")
    storm, calm = world.token("storm", auth.READ), world.token("calm", auth.READ)
    results: list[falcon.testing.Result] = []
    held = [threading.Thread(target=lambda: results.append(_list(client, storm))) for _ in range(CAP)]
    for thread in held:
        thread.start()
    gate.wait_inside(CAP)
    refused = assert_problem(_list(client, storm), 429)
    assert refused["type"] == "urn:dispatcher:problem:too-many-requests-in-flight"
    assert f"{CAP} requests" in refused["detail"]
    assert _list(client, storm).headers["retry-after"] == "1"
    assert _list(client, calm).status_code == 200  # the other workspace is served meanwhile
    assert client.simulate_get("/healthz").status_code == 200  # not counted
    gate.open.set()
    for thread in held:
        thread.join(60)
    assert [r.status_code for r in results] == [200] * CAP
    assert _list(client, storm).status_code == 200  # the slots came back


def test_slots_are_given_back_after_errors(world: World, make_client: ClientFactory,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    client = make_client(api={"requests_in_flight_per_workspace": CAP})
    world.workspace("acme")
    token = world.token("acme", auth.READ, auth.WRITE)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    with monkeypatch.context() as patch:
        patch.setattr(delivery_store, "list_deliveries", broken)
        for _ in range(CAP + 1):
            assert_problem(_list(client, token), 500)
    for _ in range(CAP + 1):  # refused after admission: a bad filter, an unknown id
        assert_problem(client.simulate_get("/v2/webhooks/deliveries", headers=bearer(token),
                                           query_string="status=nope"), 400)
        assert_problem(client.simulate_get("/v2/webhooks/deliveries/9999", headers=bearer(token)), 404)
        assert_problem(client.simulate_post("/v2/webhooks/deliveries/9999/replay", headers=bearer(token)), 404)
    assert _list(client, token).status_code == 200
