"""The YAML config of a test or benchmark run against its own database."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

# Settings every benchmark config takes last (``python -m benchmarks --set section.key=value``),
# as JSON of ``{"section__key": value}``: the environment carries them into the harness's own
# subprocesses too.
BENCH_SETTINGS_ENV = "DISPATCHER_BENCH_SET"


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with ``overrides`` applied in place: ``section__key=value`` sets one key, a
    dict merges into the section of that name, anything else replaces it."""
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        if key:
            raw.setdefault(section, {})[key] = value
        elif isinstance(value, dict) and isinstance(raw.get(section), dict):
            raw[section] = {**raw[section], **value}
        else:
            raw[section] = value
    return raw


def config_for_test(dsn: str, **overrides: Any) -> dict[str, Any]:
    """A test's config: one worker, quick polls, plain http to loopback, no statsd."""
    raw: dict[str, Any] = {
        "region": "test",
        "database": {"dsn": dsn},
        "http": {"require_https": False, "allow_private_networks": True, "timeout": "2s"},
        "workers": {"processes": 1, "poll_interval": "100ms", "lease": "10s", "heartbeat_interval": "200ms"},
        "statsd": {"enabled": False},
        "logging": {"level": "INFO"},
    }
    return apply_overrides(raw, overrides)


def bench_config(dsn: str, log_file: Path, statsd_port: int, **sections: dict[str, Any]) -> dict[str, Any]:
    """A benchmark's config: every feature on (statsd to ``statsd_port``, logs to a file), loopback allowed."""
    raw: dict[str, Any] = {
        "region": "bench",
        "database": {"dsn": dsn},
        "workers": {"processes": 2},
        "http": {"require_https": False, "allow_private_networks": True},
        "statsd": {"host": "127.0.0.1", "port": statsd_port, "prefix": "dispatcher.bench", "enabled": True},
        "logging": {"level": "INFO", "file": str(log_file)},
    }
    apply_overrides(raw, sections)
    return apply_overrides(raw, json.loads(os.environ.get(BENCH_SETTINGS_ENV) or "{}"))


def write_config(path: Path, document: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(document)), encoding="utf-8")
    return path
