"""A quiet first run: the embedded Postgres' start-up (initdb's whole output,
platformdirs' RuntimeDirWarning) goes to a log file under the data
directory's parent, whose path is printed once; ``-v`` shows it on stderr too.

Run as the README's first command runs: the CLI in a subprocess, on a new
embedded data directory, without XDG_RUNTIME_DIR (as in a container or CI).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from dispatcher.runtime.embedded import LOG_NAME

REPO = Path(__file__).resolve().parents[2]


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_") and k != "XDG_RUNTIME_DIR"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "dispatcher.cli", "-c", str(config), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_first_run_shows_the_product_not_the_embedded_servers_start_up(data_dir: Path) -> None:
    config = data_dir.parent / "local.yaml"
    config.write_text(yaml.safe_dump({"database": {"dsn": "embedded", "embedded_dir": str(data_dir)},
                                      "statsd": {"enabled": False}}))
    log = data_dir.parent / LOG_NAME

    first = cli(config, "migrate")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("migrated: applied")
    assert "pgserver" not in first.stderr and "RuntimeDirWarning" not in first.stderr, first.stderr
    assert first.stderr.count(str(log)) == 1, first.stderr
    assert len(first.stderr.strip().splitlines()) == 1, first.stderr
    written = log.read_text()
    assert "INFO pgserver" in written and "initdb" in written

    # -v: the same lines reach stderr as well (the server is reused this time).
    verbose = cli(config, "-v", "migrate")
    assert verbose.returncode == 0, verbose.stderr
    assert "INFO pgserver" in verbose.stderr

