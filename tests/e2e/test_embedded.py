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
