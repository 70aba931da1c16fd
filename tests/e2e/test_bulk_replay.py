"""Bulk replay end to end (issue 24, section 3): the dispatcher running, its
rows dead after an outage, then ``dispatcher replay`` run as a command.  The
upkeep leader's replay loop queues the job, the CLI prints its progress to
100 %, and the receiver gets every event again, each once, with the event's
own id as its Idempotency-Key and a signature it verifies (a current timestamp).

The 24 h window is 1 s here; the upkeep leader runs every 200 ms.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dispatcher_devtools.kit import SECRET, Dispatcher, produce, query, seed_workspace, status_counts
from dispatcher_devtools.receiver import ReceiverProcess
from tests.e2e.test_cli import cli
from tests.support.faults import settle

pytestmark = pytest.mark.timeout(120)

QUICK = {"alerts": {"check_interval": "200ms"}, "workers": {"poll_interval": "50ms"},
         "retry": {"base": "100ms", "max_interval": "300ms", "ceiling": "1s", "jitter": 0},
         "breaker": {"failure_threshold": 1000}}


def test_the_cli_replays_an_outage_and_follows_the_job_to_100_percent(db, write_config, tmp_path: Path) -> None:
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url("status", "outage", code=503)])
        config = write_config(db, **QUICK)
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            settle(dispatcher, db.dsn, lambda: "started (client=" in dispatcher.log(), "the worker")
            events = produce(config, db.dsn, "ws", 8)
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"dead": 8}, "every row dead")
            receiver.set_profile("outage", "ok")

            dry = cli("-c", str(config), "replay", "--workspace", "ws", "--status", "dead", "--dry-run")
            assert dry.returncode == 0, dry.stderr
            assert dry.stdout.splitlines()[0] == "8" and "costing 1 replay units" in dry.stderr
            assert status_counts(db.dsn) == {"dead": 8}

            run = cli("-c", str(config), "replay", "--workspace", "ws", "--status", "dead", "--request-id", "o1")
            assert run.returncode == 0, run.stderr
            lines = run.stdout.splitlines()
            job = int(lines[0])
            assert lines[-1] == f"job {job}: done, 8/8 queued (100 %)", lines
            assert all(re.fullmatch(rf"job {job}: (done, )?\d/8 queued \(\d+ %\)", line) for line in lines[1:])
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"dead": 8, "delivered": 8},
                   "every replay delivered")
            again = cli("-c", str(config), "replay", "--workspace", "ws", "--status", "dead", "--request-id", "o1")
            assert again.returncode == 0 and int(again.stdout.splitlines()[0]) == job
        assert status_counts(db.dsn) == {"dead": 8, "delivered": 8}
        delivered = {d.webhook_id: d for d in receiver.deliveries() if d.ok}
        assert set(delivered) == set(events)
        assert all(d.ok == 1 and d.idempotency_keys == (d.webhook_id,) for d in delivered.values())
        assert query(db.dsn, "SELECT count(DISTINCT replay_of) FROM webhook_deliveries WHERE replay_of IS NOT NULL"
                     ) == [(8,)]
