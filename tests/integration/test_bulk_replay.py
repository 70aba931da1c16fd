"""Bulk replay by filter (issue 24, section 3): the API, the job the upkeep
leader runs and the CLI, against a real Postgres.

The job is run here by the worker's own runner (``engine.replayer``) on its
own connection, batch by batch, as the leader's replay loop runs it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from dispatcher.cli.main import main as cli_main
from dispatcher.engine.replayer import BulkReplayer
from dispatcher.rules.bulk_replay import BulkReplayPolicy
from dispatcher.store.engine import ManagedConnection
from dispatcher.store.replays import ReplayJobStore
from tests.integration.test_api import World, assert_problem, bearer, make_client, world

if TYPE_CHECKING:
    from tests.conftest import TestDatabase

__all__ = ["make_client", "world"]  # fixtures, used by name

HOUR = timedelta(hours=1)
PATH = "/v2/webhooks/replays"


@pytest.fixture
def runner(db: TestDatabase) -> Iterator[BulkReplayer]:
    """The leader's runner, with batches of 2 rows so every job here takes several."""
    conn = ManagedConnection(db.dsn, "test replay")
    yield BulkReplayer(ReplayJobStore(conn), BulkReplayPolicy(batch_rows=2, pause=0))
    conn.close()


def drain(runner: BulkReplayer) -> int:
    """Run batches until no job is running; returns how many batches ran."""
    batches = 0
    while runner.run_once():
        batches += 1
        assert batches < 1000
    return batches


def seeded(world: World, ws: str, event: str, endpoint: int, status: str, type_: str = "job.completed",
           age: timedelta = HOUR, **kwargs: Any) -> int:
    """A row of ``event`` (created ``age`` ago, event and row alike) on ``endpoint``."""
    if not world.sql("SELECT 1 FROM events WHERE id = %s AND workspace_id = %s", (event, ws)):
        world.event(ws, event, type_)
        world.sql("UPDATE events SET created_at = now() - %s WHERE id = %s AND workspace_id = %s", (age, event, ws))
    return world.delivery(ws, endpoint, event, status, age=age, **kwargs)


def outage(world: World) -> dict[str, Any]:
    """An outage between 5 h and 2 h ago, with rows the filter must and must not pick."""
    ws = world.workspace("acme")
    ep, other, off = world.endpoint(ws), world.endpoint(ws, "https://b.example.test/"), world.endpoint(ws, active=False)
    h = HOUR
    want = {
        seeded(world, ws, "e1", ep, "dead", age=4 * h), seeded(world, ws, "e2", ep, "failed", age=3 * h),
        seeded(world, ws, "e3", other, "dead", age=3 * h), seeded(world, ws, "e4", ep, "dead", age=2.5 * h),
        seeded(world, ws, "e5", other, "failed", age=4.5 * h),
    }
    seeded(world, ws, "e6", ep, "dead", age=4 * h)
    want.add(world.delivery(ws, ep, "e6", "dead", age=h))  # the event's newest row on ep: a failed replay
    not_wanted = [
        seeded(world, ws, "old", ep, "dead", age=7 * h),                          # before since
        seeded(world, ws, "late", ep, "dead", age=h),                             # after until
        seeded(world, ws, "ok", ep, "delivered", age=3 * h),                      # status not asked for
        seeded(world, ws, "waiting", ep, "pending", age=3 * h),                   # still being tried
        seeded(world, ws, "shadow", ep, "dead", age=3 * h, mode="shadow"),        # never sent
        seeded(world, ws, "off", off, "dead", age=3 * h),                         # inactive endpoint
        seeded(world, ws, "typed", ep, "dead", type_="invoice.paid", age=3 * h),  # type not asked for
    ]
    fixed = seeded(world, ws, "fixed", ep, "dead", age=3 * h)
    world.delivery(ws, ep, "fixed", "delivered", replay_of=fixed)                # already replayed
    not_wanted.append(fixed)
    other_ws = world.workspace("other")
    not_wanted.append(seeded(world, other_ws, "e1", world.endpoint(other_ws), "dead", age=3 * h))
    now = datetime.now(UTC)
    body = {"since": (now - 5 * h).isoformat(), "until": (now - 2 * h).isoformat(), "types": ["job.completed"],
            "statuses": ["dead", "failed"]}
    return {"ws": ws, "ep": ep, "other": other, "want": want, "not_wanted": not_wanted, "body": body,
            "headers": bearer(world.token(ws))}


def replays(world: World) -> list[tuple[Any, ...]]:
    return world.sql("SELECT replay_of, event_id, endpoint_id, status, attempt, mode FROM webhook_deliveries"
                     " WHERE replay_of IS NOT NULL AND status = 'pending' ORDER BY replay_of")


def test_dry_run_count_equals_what_the_job_queues(world, make_client, runner) -> None:
    client, seen = make_client(), outage(world)
    rows_before = world.count()
    dry = client.simulate_post(PATH, headers=seen["headers"], json={**seen["body"], "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert dry.json["count"] == len(seen["want"]) and dry.json["replay_units"] == 1 and not dry.json["count_capped"]
    assert {s["delivery_id"] for s in dry.json["sample"]} == seen["want"]  # fewer than the sample's 10
    assert world.count() == rows_before and not world.sql("SELECT 1 FROM api_replay_ledger")  # nothing queued, paid
    made = client.simulate_post(PATH, headers=seen["headers"], json=seen["body"])
    assert made.status_code == 202, made.text
    job = made.json
    assert job["total"] == dry.json["count"] and job["state"] == "running" and job["percent"] == 0
    assert made.headers["location"] == f"{PATH}/{job['id']}"
    assert drain(runner) >= 3  # batches of 2
    queued = replays(world)
    assert len(queued) == dry.json["count"]
    assert {r[0] for r in queued} == seen["want"] and not {r[0] for r in queued} & set(seen["not_wanted"])
    assert {r[3:] for r in queued} == {("pending", 0, "live")}
    # Same event (so the same Idempotency-Key on the wire) and endpoint as the row replayed.
    for replay_of, event_id, endpoint_id, *_ in queued:
        assert world.sql("SELECT event_id, endpoint_id FROM webhook_deliveries WHERE id = %s",
                         (replay_of,)) == [(event_id, endpoint_id)]
    done = client.simulate_get(f"{PATH}/{job['id']}", headers=seen["headers"]).json
    assert (done["state"], done["queued"], done["total"], done["percent"]) == ("done", len(seen["want"]),
                                                                             len(seen["want"]), 100)
    entry = world.sql("SELECT action, token_id IS NOT NULL, detail FROM api_audit WHERE action = 'replay.bulk'")
    assert len(entry) == 1 and entry[0][1] and entry[0][2]["job_id"] == job["id"] and entry[0][2]["total"] == 6
    assert world.sql("SELECT sum(units) FROM api_replay_ledger") == [(1,)]


def test_a_paused_endpoints_replays_are_written_held(world, make_client, runner) -> None:
    """Like a single replay (api_insert_replay), a bulk replay to a paused endpoint is held, not pending:
    nothing is sent to it until the resume, and the upkeep has no straggler to hold."""
    client, seen = make_client(), outage(world)
    world.sql("UPDATE webhook_endpoints SET paused_at = now(), pause_cause = 'customer' WHERE id = %s RETURNING id",
              (seen["ep"],))
    made = client.simulate_post(PATH, headers=seen["headers"], json=seen["body"])
    assert made.status_code == 202, made.text
    drain(runner)
    queued = world.sql("SELECT endpoint_id, status FROM webhook_deliveries WHERE replay_of IS NOT NULL"
                       " AND replay_of = ANY (%s)", (sorted(seen["want"]),))
    assert len(queued) == len(seen["want"])
    assert {status for endpoint_id, status in queued if endpoint_id == seen["ep"]} == {"held"}
    assert {status for endpoint_id, status in queued if endpoint_id == seen["other"]} == {"pending"}


def test_progress_rises_to_100_percent(world, make_client, runner) -> None:
    client, seen = make_client(), outage(world)
    job = client.simulate_post(PATH, headers=seen["headers"], json=seen["body"]).json
    shown = [job["percent"]]
    while runner.run_once():
        shown.append(client.simulate_get(f"{PATH}/{job['id']}", headers=seen["headers"]).json["percent"])
    assert shown == sorted(shown) and shown[-1] == 100 and shown.count(100) == 1
    assert 0 < shown[1] < 100  # a batch of 2 of 6 rows shows in between


def test_a_retried_request_queues_nothing_twice(world, make_client, runner) -> None:
    client, seen = make_client(), outage(world)
    headers = {**seen["headers"], "Idempotency-Key": "outage-42"}
    first = client.simulate_post(PATH, headers=headers, json=seen["body"])
    again = client.simulate_post(PATH, headers=headers, json=seen["body"])
    assert (first.status_code, again.status_code) == (202, 200) and again.json["id"] == first.json["id"]
    drain(runner)
    late = client.simulate_post(PATH, headers=headers, json=seen["body"])  # retried after the job ran
    assert late.status_code == 200 and late.json["id"] == first.json["id"] and late.json["state"] == "done"
    # The same key for another filter is refused, not taken for the first request.
    assert_problem(client.simulate_post(PATH, headers=headers, json={**seen["body"], "statuses": ["dead"]}), 409)
    # A request id in the body works as the header does; a new request finds every pair already queued.
    body = {**seen["body"], "request_id": "outage-43"}
    other = client.simulate_post(PATH, headers=seen["headers"], json=body)
    assert other.status_code == 202 and other.json["total"] == 0 and other.json["state"] == "done"
    assert client.simulate_post(PATH, headers=seen["headers"], json=body).json["id"] == other.json["id"]
    drain(runner)
    queued = replays(world)
    assert sorted(r[0] for r in queued) == sorted(seen["want"])  # each once
    assert world.sql("SELECT count(*), sum(units) FROM api_replay_ledger") == [(1, 1)]  # paid once
    assert world.sql("SELECT count(*) FROM api_audit WHERE action = 'replay.bulk'") == [(2,)]


def test_a_batch_cut_short_is_run_again_and_queues_nothing_twice(world, make_client, db, runner) -> None:
    client, seen = make_client(), outage(world)
    job = client.simulate_post(PATH, headers=seen["headers"], json=seen["body"]).json
    crashed = ManagedConnection(db.dsn, "test crash")
    store = ReplayJobStore(crashed)

    class Crash(Exception):
        pass

    # A leader dies between queuing a batch and committing it: nothing of it stays.
    original = crashed.transaction

    def dying() -> Any:
        from contextlib import contextmanager

        @contextmanager
        def tx() -> Iterator[Any]:
            with original() as inner:
                class Dies:
                    def execute(self, sql: str, params: Any = None, commit: bool = False) -> None:
                        if "UPDATE replay_jobs" in sql:
                            raise Crash
                        inner.execute(sql, params)

                    def fetchall(self) -> list[dict[str, Any]]:
                        return inner.fetchall()
                yield Dies()
        return tx()

    crashed.transaction = dying  # type: ignore[method-assign]
    with pytest.raises(Crash):
        store.run_batch(job["id"], 2)
    crashed.close()
    assert replays(world) == []
    # Two leaders at once (a lapsed lease): the job's row lock orders their batches.
    second = ManagedConnection(db.dsn, "test second leader")
    twin = BulkReplayer(ReplayJobStore(second), BulkReplayPolicy(batch_rows=2, pause=0))
    thread = threading.Thread(target=drain, args=(twin,))
    thread.start()
    drain(runner)
    thread.join(30)
    second.close()
    queued = replays(world)
    assert sorted(r[0] for r in queued) == sorted(seen["want"])
    shown = client.simulate_get(f"{PATH}/{job['id']}", headers=seen["headers"]).json
    assert (shown["queued"], shown["percent"]) == (len(seen["want"]), 100)


def test_bad_filters_get_a_clear_4xx(world, make_client) -> None:
    client, seen = make_client(), outage(world)
    now = datetime.now(UTC)
    cases: list[tuple[Any, int, str]] = [
        ({"since": "2020-01-01T00:00:00Z"}, 422, "days back"),
        ({"since": (now - HOUR).isoformat(), "until": (now - 2 * HOUR).isoformat()}, 422, "until"),
        ({"since": (now + HOUR).isoformat()}, 422, "future"),
        ({"statuses": ["pending"]}, 422, "pending"), ({"statuses": []}, 422, "statuses"),
        ({"endpoints": [999999]}, 422, "endpoint 999999"), ({"endpoints": ["1"]}, 400, "endpoints"),
        ({"types": "job.completed"}, 400, "types"), ({"types": [""]}, 422, "event type"),
        ({"since": "yesterday"}, 400, "since"), ({"dry_run": "yes"}, 400, "dry_run"),
        ({"statuss": ["dead"]}, 400, "statuss"), ([], 400, "object"), ({"request_id": ""}, 400, "request_id"),
    ]
    for body, status, named in cases:
        for dry in (True, False):
            sent = {**body, "dry_run": body.get("dry_run", dry)} if isinstance(body, dict) else body
            result = client.simulate_post(PATH, headers=seen["headers"], body=json.dumps(sent))
            assert result.status_code == status, (body, result.text)
            assert named in assert_problem(result, status)["detail"], (body, result.text)
    bad_key = {**seen["headers"], "Idempotency-Key": "a b"}
    assert_problem(client.simulate_post(PATH, headers=bad_key, json=seen["body"]), 400)
    assert_problem(client.simulate_get(f"{PATH}/abc", headers=seen["headers"]), 404)
    job = client.simulate_post(PATH, headers=seen["headers"], json=seen["body"]).json
    other = bearer(world.token("other"))
    assert_problem(client.simulate_get(f"{PATH}/{job['id']}", headers=other), 404)  # another workspace's
    read_only = bearer(world.token(seen["ws"], "webhooks:read"))
    assert client.simulate_post(PATH, headers=read_only, json=seen["body"]).status_code == 403
    assert world.sql("SELECT count(*) FROM replay_jobs") == [(1,)]


def test_the_budget_is_charged_per_100_rows_and_refuses_whole(world, make_client) -> None:
    client = make_client(api__replays_per_hour=2)
    ws = world.workspace("acme")
    ep = world.endpoint(ws)
    world.sql("INSERT INTO events (id, workspace_id, type, sequence, payload)"
              " SELECT 'b' || n, %s, 'job.completed', 1000 + n, '{}' FROM generate_series(1, 250) n", (ws,))
    world.sql("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, event_day)"
              " SELECT %s, %s, e.id, 'sha256:x', 'dead', e.day FROM generate_series(1, 250) n"
              " JOIN events e ON e.workspace_id = %s AND e.id = 'b' || n", (ws, ep, ws))
    headers = bearer(world.token(ws))
    dry = client.simulate_post(PATH, headers=headers, json={"dry_run": True}).json
    # Counted up to one row past what 2 units can ever pay for (200 rows): a huge filter costs no huge count.
    assert (dry["count"], dry["count_capped"], dry["replay_units"], len(dry["sample"])) == (201, True, 3, 10)
    narrow = client.simulate_post(PATH, headers=headers, json={"dry_run": True, "endpoints": [ep]}).json
    assert narrow["count_capped"] and narrow["count"] == 201
    refused = client.simulate_post(PATH, headers=headers, json={})
    assert_problem(refused, 422)  # 3 units can never fit an hourly limit of 2
    assert world.sql("SELECT count(*) FROM replay_jobs") == [(0,)] and world.count("replay_of IS NOT NULL") == 0
    made = client.simulate_post(PATH, headers=headers, json={"endpoints": [ep], "statuses": ["dead"],
                                                             "types": ["job.completed"], "since": None})
    assert made.status_code == 422  # the same 250 rows, however the filter is written


def test_a_retry_without_since_finds_the_same_job(world, make_client) -> None:
    """since defaults to 24 h before each request: a retry moments later is still the same request."""
    client, seen = make_client(), outage(world)
    headers = {**seen["headers"], "Idempotency-Key": "no-since"}
    first = client.simulate_post(PATH, headers=headers, json={"types": ["job.completed"]})
    again = client.simulate_post(PATH, headers=headers, json={"types": ["job.completed"], "since": None})
    assert (first.status_code, again.status_code) == (202, 200) and again.json["id"] == first.json["id"]


# ---------------------------------------------------------------- the CLI


def test_cli_dry_run_then_job_with_progress(world, db, write_config, runner, capsys) -> None:
    seen = outage(world)
    config = write_config(db)
    since, until = seen["body"]["since"], seen["body"]["until"]
    args = ["replay", "--workspace", seen["ws"], "--since", since, "--until", until, "--type", "job.completed",
            "--status", "dead,failed"]
    assert cli_main(["-c", str(config), *args, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(len(seen["want"])) and len(out) == 1 + len(seen["want"])
    assert world.sql("SELECT count(*) FROM replay_jobs") == [(0,)]
    stop = threading.Event()

    def leader() -> None:
        while not stop.is_set():
            if not runner.run_once():
                stop.wait(0.05)

    thread = threading.Thread(target=leader)
    thread.start()
    try:
        assert cli_main(["-c", str(config), *args, "--request-id", "r1"]) == 0
    finally:
        stop.set()
        thread.join(30)
    out = capsys.readouterr().out.splitlines()
    job_id = int(out[0])
    assert out[-1] == f"job {job_id}: done, 6/6 queued (100 %)"
    assert len(replays(world)) == len(seen["want"])
    # Run again with the same request id: the same job, nothing queued again.
    assert cli_main(["-c", str(config), *args, "--request-id", "r1"]) == 0
    assert int(capsys.readouterr().out.splitlines()[0]) == job_id
    assert len(replays(world)) == len(seen["want"])
    audit = world.sql("SELECT token_id FROM api_audit WHERE action = 'replay.bulk'")
    assert audit == [(None,)]  # an operator


@pytest.mark.parametrize(("args", "code", "named"), [
    (["--status", "pending"], 2, "pending"),
    (["--since", "2026-09-01T02:00:00"], 2, "offset"),
    (["--since", "2020-01-01T00:00:00Z"], 2, "days back"),
    (["--endpoint", "x"], 2, "endpoint id"),
    (["--endpoint", "999999"], 1, "endpoint 999999"),
])
def test_cli_bad_filters_exit_non_zero_naming_the_problem(world, db, write_config, capsys, args, code,
                                                          named) -> None:
    world.workspace("acme")
    config = write_config(db)
    with pytest.raises(SystemExit) as exited:
        cli_main(["-c", str(config), "replay", "--workspace", "acme", *args])
    assert exited.value.code == code
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exited:
        cli_main(["-c", str(config), "replay", "--workspace", "nobody", "--dry-run"])
    assert exited.value.code == 1 and "'nobody' does not exist" in capsys.readouterr().err
