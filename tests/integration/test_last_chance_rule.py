"""The last chance at the retry ceiling (docs/decisions.md, "Last chance") has one
home, ``dispatcher.rules.breaker.last_chance_spent``; the upkeep leader's sweep
(``engine_sweep_expired`` in ``sql/engine.sql``, run by ``Upkeep``) is its SQL
twin, and both are held to the same table of cases here.

A pending row past its ceiling ends ``dead`` without an attempt of its own only
behind an ``open`` breaker whose window opened (the failure that reached the
threshold, or a failed probe) at or after the row's ceiling: the endpoint failed
an attempt the breaker admitted after the row's window ended.  Every other row
waits for an attempt that decides it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dispatcher.config import Config, config_from_mapping
from dispatcher.engine.upkeep import Upkeep
from dispatcher.metrics import Metrics
from dispatcher.rules.breaker import (
    BreakerBatch,
    BreakerPolicy,
    BreakerSignal,
    EndpointBreaker,
    Signal,
    last_chance_spent,
)
from dispatcher.rules.retry import LAST_CHANCE_SPENT
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher_devtools.kit import query, seed_workspace

CEILING = 3600.0          # retry.ceiling of the default policy
SHORT = 600.0             # the `short.lived` event type's own ceiling
T0 = 1_800_000_000.0      # a creation time for the pure rule


@dataclass(frozen=True)
class Case:
    name: str
    state: str
    opened: float | None   # when the breaker's window opened, seconds after the row's creation; None: not stored
    age: float             # the row's age now
    event_type: str        # "": the event is missing (the default policy applies)
    dies: bool

    @property
    def ceiling(self) -> float:
        return SHORT if self.event_type == "short.lived" else CEILING


CASES = [
    Case("open, opened after the row's ceiling", "open", CEILING + 30, CEILING + 60, "job.created", True),
    Case("open, opened at the row's ceiling", "open", CEILING, CEILING + 60, "job.created", True),
    Case("open, opened before the row's ceiling", "open", CEILING - 30, CEILING + 60, "job.created", False),
    Case("open, no opening stored", "open", None, CEILING + 60, "job.created", False),
    Case("half open: the probe in flight decides", "half_open", CEILING + 30, CEILING + 60, "job.created", False),
    Case("closed: the claim sends it", "closed", CEILING + 30, CEILING + 60, "job.created", False),
    Case("open, the row's window not over", "open", CEILING - 600, CEILING - 300, "job.created", False),
    Case("open, the event type's own shorter ceiling", "open", SHORT + 30, SHORT + 100, "short.lived", True),
    Case("open, the same moment under the default ceiling", "open", SHORT + 30, SHORT + 100, "job.created", False),
    Case("open, the event missing: the default ceiling", "open", CEILING + 30, CEILING + 60, "", True),
]
IDS = [case.name for case in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_rule(case: Case) -> None:
    policy = _config("postgresql://unused").retry.retry_policies().for_event_type(case.event_type)
    assert policy.ceiling == case.ceiling
    breaker = EndpointBreaker(case.state, 20, T0 + case.age + 60)
    opened_at = None if case.opened is None else T0 + case.opened
    assert last_chance_spent(breaker, opened_at, T0 + policy.ceiling) is case.dies


def _config(dsn: str) -> Config:
    return config_from_mapping({"region": "test", "database": {"dsn": dsn}, "statsd": {"enabled": False},
                                "retry": {"ceiling": "1h", "policies": {"short.lived": {"ceiling": "10m"}}}},
                               env={})


def _seed(dsn: str, case: Case, leased: bool = False) -> int:
    """One endpoint, its breaker as the case says, and one pending row of the case's age; the row's id."""
    (endpoint,) = seed_workspace(dsn, "ws", ["http://127.0.0.1:9/a"])
    if case.event_type:
        query(dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) VALUES ('ev', 'ws', %s, 1, '{}')",
              (case.event_type,))
    # One statement: now() is one instant, so "opened at the row's ceiling" is exact.
    (row_id,) = query(dsn, """
        WITH row AS (
            INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, attempt,
                                            created_at, locked_until, locked_by, claim_token, event_day)
            VALUES ('ws', %(endpoint)s, 'ev', 'h', 3, now() - make_interval(secs => %(age)s),
                    CASE WHEN %(leased)s THEN now() + interval '30 seconds' END,
                    CASE WHEN %(leased)s THEN 'w' END, CASE WHEN %(leased)s THEN 1 END,
                    coalesce((SELECT day FROM events WHERE workspace_id = 'ws' AND id = 'ev'), dispatcher_today()))
            RETURNING id, created_at)
        INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, opened_at)
        SELECT %(endpoint)s, %(state)s, 20, now() + interval '1 minute',
               row.created_at + make_interval(secs => %(opened)s)
          FROM row
        RETURNING (SELECT id FROM row)""",
                      {"endpoint": endpoint, "age": case.age, "leased": leased, "state": case.state,
                       "opened": case.opened})[0]
    return int(row_id)


def _upkeep_round(dsn: str) -> None:
    config = _config(dsn)
    Upkeep(config, EngineStore(ManagedConnection(dsn, "test")), Metrics(config.statsd)).run_once()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_sweep_follows_the_rule(db, case: Case) -> None:
    row_id = _seed(db.dsn, case)
    _upkeep_round(db.dsn)
    ((status, attempt, last_error),) = query(db.dsn, "SELECT status, attempt, last_error FROM webhook_deliveries "
                                                     "WHERE id = %s", (row_id,))
    assert (status == "dead") == case.dies, (status, last_error)
    assert attempt == 3, "the sweep makes no attempt and counts none"
    if case.dies:
        assert last_error == LAST_CHANCE_SPENT


def test_a_leased_row_is_left_to_its_worker(db) -> None:
    row_id = _seed(db.dsn, CASES[0], leased=True)
    _upkeep_round(db.dsn)
    assert query(db.dsn, "SELECT status FROM webhook_deliveries WHERE id = %s", (row_id,)) == [("pending",)]


def test_every_window_records_when_it_opened(db) -> None:
    """A failure after an open window lapsed opens a new window, with or without a
    probe flipped first: the stored opening moves with it, or the rows behind it
    would wait one more window than the rule allows."""
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    query(db.dsn, "INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, opened_at) "
                  "VALUES (%s, 'open', 20, now() - interval '1 second', now() - interval '1 hour')", (endpoint,))
    store = EngineStore(ManagedConnection(db.dsn, "test"))
    policy = BreakerPolicy(failure_threshold=20, open_for=300.0)
    (write,) = store.update_breakers([endpoint], BreakerBatch(policy, [Signal(endpoint, BreakerSignal.FAILURE, "x")]))
    assert write.breaker.state == "open" and BreakerPolicy.transitions(write.previous, write.breaker) == "reopened"
    assert query(db.dsn, "SELECT now() - opened_at < interval '1 minute' FROM endpoint_state") == [(True,)]
    # A failure inside a running window opens nothing: the stored opening stays.
    query(db.dsn, "UPDATE endpoint_state SET opened_at = now() - interval '10 seconds'")
    store.update_breakers([endpoint], BreakerBatch(policy, [Signal(endpoint, BreakerSignal.FAILURE, "x")]))
    assert query(db.dsn, "SELECT now() - opened_at >= interval '10 seconds' FROM endpoint_state") == [(True,)]
