"""The dispatcher through PgBouncer in transaction pooling mode (issue 13 item 5).

A transaction pooler hands each transaction to whichever server connection is
free, so session state means nothing: prepared statements (``42P05 already
exists`` / ``does not exist``), session settings and session advisory locks
(every worker "won" the upkeep leadership).  The test starts Debian's
``pgbouncer`` (``tests/setup.sh`` installs it) on a loopback port in front of the test
Postgres, and runs migrate, a producer, two worker processes and the API
through it.  pgbouncer reaches the server the way the test DSN names it: over
TCP, or over the unix socket of the embedded server (``host=`` a directory).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg2.extensions
import pytest

from dispatcher_devtools.kit import (
    Dispatcher,
    SessionActivity,
    free_port,
    produce,
    query,
    seed_workspace,
    status_counts,
    wait_until,
)
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support.faults import settle

pytestmark = pytest.mark.timeout(240)

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
EVENTS = 2000


def _server_address(dsn: str) -> tuple[str, str]:
    """``(host, port)`` of the server ``dsn`` names; the host may be a unix socket directory."""
    params = psycopg2.extensions.parse_dsn(dsn)
    host = params.get("host") or ""
    if not host:
        pytest.fail(f"the test DSN {dsn!r} names no host (a TCP host or a socket directory)")
    return host, params.get("port") or "5432"


def _run_as(host: str) -> str:
    """The user a root-started pgbouncer drops to (it refuses to run as root): one that can
    reach the server, i.e. the owner of its socket directory, else Debian's ``postgres``."""
    if host.startswith("/") and Path(host).owner() != "root":
        return Path(host).owner()
    return "postgres"


@pytest.fixture
def pgbouncer(empty_db) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A pgbouncer (pool_mode transaction) in front of the test database; yields its DSN."""
    if not Path(PGBOUNCER).exists():
        pytest.fail("pgbouncer is not installed (apt-get install pgbouncer; tests/setup.sh does it)")
    with tempfile.TemporaryDirectory(prefix="dispatcher-pgbouncer-") as path:
        folder = Path(path)
        # pgbouncer refuses to run as root: it drops to postgres (-u), which must write here.
        folder.chmod(0o777)
        yield from _run_pgbouncer(folder, empty_db.dsn)


def _run_pgbouncer(folder: Path, server_dsn: str) -> Iterator[str]:
    port = free_port()
    host, server_port = _server_address(server_dsn)
    (folder / "userlist.txt").write_text('"postgres" ""\n')
    ini = folder / "pgbouncer.ini"
    ini.write_text(f"""[databases]
* = host={host} port={server_port}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/userlist.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
""")
    command = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:
        command[1:1] = ["-u", _run_as(host)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return process.poll() is not None  # exited: stop waiting, and fail below

        wait_until(listening, timeout=15, interval=0.1, message=f"pgbouncer to listen on port {port}")
        if process.poll() is not None:
            log = (folder / "pgbouncer.log").read_text() if (folder / "pgbouncer.log").exists() else ""
            pytest.fail(f"pgbouncer did not start (exit {process.poll()}):\n"
                        f"{process.stdout.read() if process.stdout else ''}{log[-2000:]}")
        yield psycopg2.extensions.make_dsn(server_dsn, host="127.0.0.1", port=str(port))
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.fixture
def receiver() -> Iterator[ReceiverProcess]:
    from dispatcher_devtools.kit import SECRET

    with ReceiverProcess(secrets=[SECRET]) as rx:
        yield rx


def test_migrate_produce_and_drain_through_pgbouncer_transaction_pooling(
        empty_db, pgbouncer: str, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    from tests.support.faults import cli

    config = write_config(empty_db, database={"dsn": pgbouncer, "prepared_statements": False},
                          workers={"processes": 2, "poll_interval": "50ms", "lease": "10s",
                                   "heartbeat_interval": "200ms"},
                          alerts={"check_interval": "200ms"})
    migrated = cli(config, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    seed_workspace(empty_db.dsn, "ws", [receiver.url("ok", f"e{i}") for i in range(4)])
    events = produce(config, pgbouncer, "ws", EVENTS // 4)
    assert len(events) == EVENTS // 4
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        settle(dispatcher, empty_db.dsn, lambda: status_counts(empty_db.dsn) == {"delivered": EVENTS},
               f"all {EVENTS} rows delivered", timeout=120)
        ((leader,),) = query(empty_db.dsn, "SELECT owner FROM region_leader")
        others = set(re.findall(r"worker (\S+) started", dispatcher.log())) - {leader}
        assert others, "a second worker ran"
        # Each other worker tries for the lease five more times through the pooler: a second
        # leader (session state leaking across pooled connections) would have appeared by then.
        for owner in others:
            SessionActivity(empty_db.dsn, "upkeep", "INSERT INTO region_leader", owner=owner).wait_for(5)
        log = dispatcher.log()
        leaders = query(empty_db.dsn, "SELECT region, owner FROM region_leader")
    assert "ERROR" not in log and "prepared statement" not in log and "Traceback" not in log, log[-3000:]
    assert len(leaders) == 1, leaders
    assert log.count("now runs region upkeep") == 1, [line for line in log.splitlines() if "upkeep" in line]
    seen = {(d.webhook_id, d.endpoint) for d in receiver.deliveries() if d.ok}
    assert len(seen) == EVENTS
