"""``database.dsn: embedded``: a pgserver Postgres started on demand and reused.

Each "run" is its own process, as a real run of the CLI is, so that reuse is
across processes and not merely pgserver's in-process handle cache.  The
server is stopped at the end of the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from dispatcher.config import DSN_ENV, DatabaseConfig
from dispatcher.runtime.embedded import EmbeddedUnavailable, resolve_dsn
from tests.support.embedded import stop

REPO = Path(__file__).resolve().parents[2]

RUN = r"""
import json, sys
from dispatcher import store
from dispatcher.runtime.embedded import start_embedded

dsn = start_embedded(sys.argv[1])
conn = store.connect(dsn)
applied = store.migrate(conn)
if len(sys.argv) > 2:
    store.create_workspace(conn, sys.argv[2], "secret", {"webhook_outbox": True})
with conn, conn.cursor() as cur:
    cur.execute("SELECT pg_postmaster_start_time()::text")
    started = cur.fetchone()[0]
    cur.execute("SELECT id FROM workspaces ORDER BY id")
    workspaces = [row[0] for row in cur.fetchall()]
print(json.dumps({"dsn": dsn, "applied": applied, "started": started, "workspaces": workspaces}))
"""


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != DSN_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run(data_dir: Path, workspace: str | None = None) -> dict[str, Any]:
    args = [sys.executable, "-c", RUN, str(data_dir)] + ([workspace] if workspace else [])
    result = subprocess.run(args, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def test_start_migrate_reuse_and_restart(data_dir: Path, tmp_path: Path) -> None:
    first = run(data_dir, "first")
    assert first["applied"], "a new embedded database is migrated from scratch"
    assert first["workspaces"] == ["first"]

    # A second run finds the server still running and reuses it.
    second = run(data_dir)
    assert second["dsn"] == first["dsn"]
    assert second["started"] == first["started"]
    assert second["applied"] == []
    assert second["workspaces"] == ["first"]

    # The CLI with `database.dsn: embedded` uses the same server.
    config = tmp_path / "embedded.yaml"
    config.write_text(yaml.safe_dump({"database": {"dsn": "embedded", "embedded_dir": str(data_dir)}}))
    cli = subprocess.run([sys.executable, "-m", "dispatcher.cli", "-c", str(config), "workspace", "create",
                          "--id", "from-cli"], cwd=REPO, env=environment(), capture_output=True, text=True,
                         timeout=90)
    assert cli.returncode == 0, cli.stderr

    # Stopped (a reboot, say), the next run starts it again on the same data.
    stop(data_dir)
    third = run(data_dir)
    assert third["started"] != first["started"]
    assert third["applied"] == []
    assert third["workspaces"] == ["first", "from-cli"]


def test_resolve_dsn_passes_a_real_dsn_through() -> None:
    assert resolve_dsn(DatabaseConfig(dsn="host=db.internal dbname=x")) == "host=db.internal dbname=x"


def test_missing_pgserver_is_a_clear_error(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['pgserver'] = None\n"
            "from dispatcher.runtime.embedded import start_embedded\n"
            f"start_embedded({str(tmp_path / 'pgdata')!r})\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environment(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert f"{EmbeddedUnavailable.__name__}: database.dsn is 'embedded' but pgserver is not installed" in result.stderr


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dispatcher.cli", "-c", str(config), *args], cwd=REPO,
                          env=environment(), capture_output=True, text=True, timeout=120)


ANNOUNCEMENT = "dispatcher: embedded Postgres in"


def test_the_server_is_announced_on_its_start_and_under_v_only(data_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "embedded.yaml"
    config.write_text(yaml.safe_dump({"database": {"dsn": "embedded", "embedded_dir": str(data_dir)}}))
    started = cli(config, "migrate")
    assert started.returncode == 0, started.stderr
    assert ANNOUNCEMENT in started.stderr  # news: this command started it
    reused = cli(config, "workspace", "create", "--id", "w", "--secret", "a-secret-of-24-bytes-or-more")
    assert reused.returncode == 0, reused.stderr
    assert ANNOUNCEMENT not in reused.stderr, reused.stderr  # every later command was a 230-character line
    verbose = cli(config, "-v", "workspace", "create", "--id", "w")
    assert verbose.returncode == 0 and ANNOUNCEMENT in verbose.stderr, verbose.stderr


def test_embedded_status_stop_and_reset(data_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "embedded.yaml"
    config.write_text(yaml.safe_dump({"database": {"dsn": "embedded", "embedded_dir": str(data_dir)}}))
    stopped = cli(config, "embedded", "status")
    assert (stopped.returncode, stopped.stdout.strip()) == (1, f"embedded Postgres in {data_dir}: stopped")
    run(data_dir, "kept")
    running = cli(config, "embedded", "status")
    assert running.returncode == 0 and "running (pid " in running.stdout, running.stdout
    pid = int(running.stdout.split("pid ")[1].split(")")[0])

    assert cli(config, "embedded", "stop").stdout.strip() == f"embedded Postgres in {data_dir}: stopped"
    assert not _alive(pid)
    assert cli(config, "embedded", "status").returncode == 1
    assert cli(config, "embedded", "stop").stdout.strip() == f"embedded Postgres in {data_dir}: was not running"
    assert run(data_dir)["workspaces"] == ["kept"]  # stop keeps the data

    refused = cli(config, "embedded", "reset")
    assert refused.returncode == 2 and "--yes" in refused.stderr and data_dir.exists()
    reset = cli(config, "embedded", "reset", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert not data_dir.exists() and cli(config, "embedded", "status").returncode == 1
    assert run(data_dir)["workspaces"] == []  # the next start is an empty database


def _alive(pid: int) -> bool:
    """A process that runs (a zombie, exited but not yet reaped by its adopter, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


SUITE_SAMPLE = "tests/integration/test_event_id_rule.py::test_an_id_over_the_limit_is_not_looked_up"


def _suite_sample(data_dir: Path, *options: str) -> None:
    env = environment()
    env.pop("DISPATCHER_TEST_DSN", None)
    env["DISPATCHER_TEST_PGDATA"] = str(data_dir)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, SUITE_SAMPLE],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_the_suite_stops_the_embedded_server_it_started_and_only_that(data_dir: Path) -> None:
    from dispatcher.runtime.embedded import server_pid

    _suite_sample(data_dir, "-n", "2")
    assert (data_dir / "PG_VERSION").exists(), "the sample run used the embedded server"
    assert server_pid(data_dir) is None, "the run left the embedded server it started running"
    run(data_dir)  # a server someone else started is theirs: the suite leaves it running
    _suite_sample(data_dir)
    assert server_pid(data_dir) is not None
