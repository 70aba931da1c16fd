"""One kit for the tests and the benchmarks (neither is gevent-patched).

* :mod:`.waiting`  -- :func:`wait_until`, polling with a bound;
* :mod:`.database` -- scratch databases (from a template, dropped WITH (FORCE)),
  :func:`query`, :func:`status_counts`;
* :mod:`.seeding`  -- workspaces and endpoints, events through ``WebhookSender``;
* :mod:`.configs`  -- the YAML config of a test or benchmark run;
* :mod:`.runner`   -- the dispatcher run as in production, in its own process group;
* :mod:`.logs`     -- structured ``event=NAME`` keys in its log lines;
* :mod:`.activity` -- :class:`SessionActivity`, statements the dispatcher's sessions finished (pg_stat_activity);
* :mod:`.replication` -- a primary and a streaming standby on loopback ports (failover, read replicas);
* :mod:`.tenants`  -- a workspace with its largest answers, a storm of clients asking for them, the API process.

The pytest fixtures stay in ``tests/conftest.py``; they call this kit.
"""

from dispatcher_devtools.kit.activity import SessionActivity
from dispatcher_devtools.kit.capture import CapturedPost, CaptureServer, capture_server
from dispatcher_devtools.kit.configs import apply_overrides, bench_config, config_for_test, write_config
from dispatcher_devtools.kit.database import (
    Database,
    ServerUnreachable,
    query,
    run_autocommit,
    scratch_database,
    status_counts,
    with_dbname,
)
from dispatcher_devtools.kit.logs import assert_no_event, log_events
from dispatcher_devtools.kit.replication import ReplicationPair, ReplicationUnavailable, free_port
from dispatcher_devtools.kit.runner import REPO, Dispatcher, process_tree
from dispatcher_devtools.kit.seeding import (
    SECRET,
    SteadyProducer,
    produce,
    seed_endpoints,
    seed_workspace,
    seed_workspaces,
)
from dispatcher_devtools.kit.waiting import WaitTimeout, wait_until

__all__ = [
    "CaptureServer",
    "CapturedPost",
    "capture_server",
    "REPO",
    "SECRET",
    "Database",
    "Dispatcher",
    "ServerUnreachable",
    "WaitTimeout",
    "apply_overrides",
    "assert_no_event",
    "bench_config",
    "config_for_test",
    "log_events",
    "free_port",
    "process_tree",
    "produce",
    "query",
    "ReplicationPair",
    "ReplicationUnavailable",
    "run_autocommit",
    "scratch_database",
    "seed_endpoints",
    "seed_workspace",
    "seed_workspaces",
    "SessionActivity",
    "status_counts",
    "SteadyProducer",
    "wait_until",
    "with_dbname",
    "write_config",
]
