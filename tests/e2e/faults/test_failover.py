"""Failover to a promoted standby (issue 13 item 5).

A real primary and a synchronous streaming standby (``pg_basebackup -R``) on
loopback ports; the dispatcher, the API and a producer all use the multi-host
DSN ``host=127.0.0.1,127.0.0.1 port=P1,P2 target_session_attrs=read-write``.
Under load the primary is stopped in immediate mode (a crash) and the standby
promoted.  Nothing is restarted: every process must find the new primary by
itself.  A second test freezes the primary instead (SIGSTOP): its sessions
hang rather than close, and the workers must leave them behind.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.engine.upkeep import LEASE_FLOOR
from dispatcher_devtools.kit import (
    Dispatcher,
    ReplicationPair,
    SteadyProducer,
    assert_no_event,
    capture_server,
    config_for_test,
    log_events,
    produce,
    query,
    seed_workspace,
    status_counts,
    wait_until,
    write_config,
)
from tests.support.faults import ApiServer, create_token, settle

pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR is not set")]

ENDPOINTS = 3
PROCESSES = 2
MAX_IN_FLIGHT = 32


@pytest.fixture
def pair() -> Iterator[ReplicationPair]:
    with ReplicationPair(synchronous=True) as started:
        yield started


def test_the_dispatcher_api_and_producer_carry_on_after_the_standby_is_promoted(
        pair: ReplicationPair, tmp_path: Path) -> None:
    dsn = pair.failover_dsn
    with capture_server() as capture:
        paths = [f"/e{n}" for n in range(ENDPOINTS)]
        seed_workspace(dsn, "ws", [capture.url + path for path in paths])
        config = write_config(tmp_path / "config.yaml", config_for_test(
            dsn, database={"dsn": dsn, "connect_timeout": "2s", "reconnect_max": "500ms"},
            workers={"processes": PROCESSES, "lease": "10s", "poll_interval": "50ms", "max_in_flight": MAX_IN_FLIGHT,
                     "heartbeat_interval": "200ms"},
            alerts={"check_interval": "200ms"}))
        token = create_token(config, "ws")
        with Dispatcher(config, tmp_path / "d.log") as dispatcher, ApiServer(config) as api, \
                SteadyProducer(config, dsn, "ws") as producer:
            workers = sorted(settle(dispatcher, dsn, lambda: len(dispatcher.worker_pids()) == PROCESSES
                                    and dispatcher.worker_pids(), f"{PROCESSES} workers"))
            settle(dispatcher, dsn, lambda: len(capture.by_event()) >= 60 * ENDPOINTS, "deliveries to flow")
            assert api.request("GET", "/v2/webhooks/deliveries?limit=1", token)[0] == 200
            leader = settle(dispatcher, dsn, lambda: query(dsn, "SELECT owner FROM region_leader"), "a leader")

            pair.primary.stop("immediate")
            stopped_at = time.monotonic()
            # A moment with no writable server at all: the old primary is gone,
            # the standby refuses read-write sessions until it is promoted.
            settle(dispatcher, pair.standby.dsn(), lambda: "claim failed" in dispatcher.log(), "a refused claim")
            pair.promote()
            promoted_at, promoted_wall = time.monotonic(), time.time()
            settle(dispatcher, dsn, lambda: len(producer.ids()) > len(producer.ids(stopped_at)) + 50,
                   "50 events committed on the new primary")
            producer.stop()
            committed = producer.ids()
            expected = {(event_id, path) for event_id in committed for path in paths}
            settle(dispatcher, dsn, lambda: expected <= set(capture.by_event()), "every committed event delivered",
                   timeout=60)
            settle(dispatcher, dsn, lambda: set(status_counts(dsn)) == {"delivered"}, "no row left pending")
            posts = capture.by_event()  # before the replay below, which sends one event again on purpose

            # The API answers from the new primary, reads and writes, without a restart.
            wait_until(lambda: _ok(api.request("GET", "/v2/webhooks/deliveries?limit=5", token)),
                       timeout=20, message="the API to read from the new primary")
            delivery_id = query(dsn, "SELECT max(id) FROM webhook_deliveries")[0][0]
            replay_status, replayed = api.request("POST", f"/v2/webhooks/deliveries/{delivery_id}/replay", token)
            assert replay_status == 202, replayed
            assert api.process is not None and api.process.poll() is None

            # The same upkeep leader renewed its lease on the new primary (an
            # unrenewed lease would end before promotion + LEASE_FLOOR).
            renewed = query(dsn, "SELECT owner FROM region_leader WHERE until > to_timestamp(%s) + make_interval("
                                 "secs => %s)", (promoted_wall, LEASE_FLOOR))
            supervisor_alive = dispatcher.process is not None and dispatcher.process.poll() is None
            worker_pids = sorted(dispatcher.worker_pids())
            log = dispatcher.log()

    events = log_events(log)
    assert supervisor_alive and events["supervisor_started"] == 1, "the supervisor was never restarted"
    assert worker_pids == workers and not events["worker_restarting"], "each worker reconnected in place"
    assert renewed == leader, (renewed, leader)
    assert events["worker_started"] == PROCESSES
    assert "claim failed, backing off" in log
    # 0 committed events lost: every one reached every endpoint.
    missing = expected - set(posts)
    assert not missing, f"{len(missing)} committed deliveries never arrived, e.g. {sorted(missing)[:5]}"
    assert len(producer.ids(stopped_at)) >= 60 and len(committed) - len(producer.ids(promoted_at)) > 0
    # Duplicates: only rows sent before the crash whose result was not recorded,
    # at most what the workers held in flight then.  (Their event may be one
    # whose COMMIT raised at the crash yet reached the standby: in doubt, so
    # not counted as committed, but written before the crash all the same.)
    duplicates = {key for key, count in posts.items() if count > 1}
    written_after = committed - producer.ids(promoted_at)
    assert not {event_id for event_id, _ in duplicates} & written_after, sorted(duplicates)[:5]
    assert len(duplicates) <= PROCESSES * MAX_IN_FLIGHT, len(duplicates)


def test_a_frozen_primary_is_left_behind_once_the_standby_is_promoted(pair: ReplicationPair, tmp_path: Path) -> None:
    """A primary that stops answering without closing its sessions (SIGSTOP: a
    hung server; a vanished host looks the same until TCP gives up, many minutes
    later): each worker's statements in flight must not wait for it forever."""
    dsn = pair.failover_dsn
    with capture_server() as capture:
        seed_workspace(dsn, "ws", [capture.url + "/frozen"])
        config = write_config(tmp_path / "config.yaml", config_for_test(
            dsn, database={"dsn": dsn, "connect_timeout": "2s", "reconnect_max": "500ms", "statement_deadline": "3s"},
            workers={"processes": 1, "lease": "10s", "poll_interval": "50ms"}, alerts={"check_interval": "200ms"}))
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            (worker,) = settle(dispatcher, dsn, dispatcher.worker_pids, "a worker")
            before = produce(config, dsn, "ws", 20)
            settle(dispatcher, dsn, lambda: {(e, "/frozen") for e in before} <= set(capture.by_event()),
                   "delivered before the freeze")
            with pair.primary.frozen():
                pair.promote()
                after = produce(config, dsn, "ws", 20)  # a new connection: libpq skips the silent host
                settle(dispatcher, pair.standby.dsn(),
                       lambda: {(e, "/frozen") for e in after} <= set(capture.by_event()),
                       "delivered by the same worker on the new primary while the old one is frozen", timeout=60)
                assert dispatcher.worker_pids() == [worker]
                dispatcher.stop()  # a graceful stop, the old primary still silent
                log = dispatcher.log()
    assert dispatcher.process is not None and dispatcher.process.returncode == 0, log[-3000:]
    assert "no answer from the database within 3s" in log
    assert_no_event(log, "worker_restarting")


def _ok(response: tuple[int, object]) -> tuple[int, object] | None:
    return response if response[0] == 200 else None
