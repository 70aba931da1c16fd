"""The README's producer snippet runs as written, against a real database.

It could not: nothing said where ``conn`` came from when the DSN is
``embedded``.  The snippet is taken from the README verbatim and run in a
fresh interpreter from the repository's root, with ``DISPATCHER_DATABASE_DSN``
pointing ``config/local.yaml`` at this test's database (as it would point a
deployment at its own), after the workspace command the README gives.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from dispatcher import store
from dispatcher.config import DSN_ENV
from dispatcher.signing import new_secret
from tests.conftest import TestDatabase as Database

REPO = Path(__file__).resolve().parents[2]


def producer_snippet() -> str:
    section = (REPO / "README.md").read_text(encoding="utf-8").split("\n## Producer API\n", 1)[1].split("\n## ")[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return snippet


def test_the_readme_producer_snippet_runs(db: Database) -> None:
    snippet = producer_snippet()
    assert "connect(config)" in snippet and "config/local.yaml" in snippet
    conn = store.connect(db.dsn)
    try:
        store.create_workspace(conn, "ws_1", new_secret(), {"webhook_outbox": True})
        endpoint = store.add_endpoint(conn, "ws_1", "http://127.0.0.1:9/hook", [], new_secret())
    finally:
        conn.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    env.update({DSN_ENV: db.dsn, "PYTHONPATH": str(REPO)})
    result = subprocess.run([sys.executable, "-c", snippet + "\nprint(stored.mode, stored.deliveries)\n"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["live", "1"]
    assert db.query("SELECT workspace_id, endpoint_id, status FROM webhook_deliveries") == [
        ("ws_1", endpoint, "pending")]
