"""A worker built on a DSN it never connects to: unit tests of its in-memory bookkeeping (lanes, claims'
sizes and pauses) use it without a database."""

from __future__ import annotations

from typing import Any

from dispatcher.config import config_from_mapping
from dispatcher.engine.worker import Worker

UNREACHABLE = "postgresql://dispatcher@127.0.0.1:9/never"


def unconnected_worker(**workers: Any) -> Worker:
    """A worker whose ``workers`` settings are the given ones (a 60 s lease unless given)."""
    config = config_from_mapping({"database": {"dsn": UNREACHABLE},
                                  "workers": {"lease": "60s", **workers}}, env={})
    return Worker(config, UNREACHABLE, "unit:a")
