"""The shared dev-tools kit's own logic (no database, no subprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher_devtools.kit import (
    ReplicationPair,
    ReplicationUnavailable,
    WaitTimeout,
    apply_overrides,
    assert_no_event,
    log_events,
    replication,
    wait_until,
)

LOG = ("2026-12-01 05:00:00,000 INFO [supervisor] dispatcher.supervisor supervisor pid 7 starting 1 worker(s) "
       "for region test event=supervisor_started\n"
       "2026-12-01 05:00:01,000 WARNING [supervisor] dispatcher.supervisor worker h:7:1 exited with -9 after 0.2s; "
       "restarting in 0.5s event=worker_restarting\n")


def test_log_events_counts_event_keys() -> None:
    assert log_events(LOG) == {"supervisor_started": 1, "worker_restarting": 1}
    assert log_events("event=worker_restarting_later") == {"worker_restarting_later": 1}


def test_assert_no_event_fails_when_the_event_was_logged() -> None:
    with pytest.raises(AssertionError, match="event=worker_restarting logged 1 time"):
        assert_no_event(LOG, "worker_restarting")
    assert_no_event(LOG, "heartbeat_missed")


def test_assert_no_event_fails_without_its_positive_control() -> None:
    # A log without event keys (say, reworded lines) must not pass the absence check silently.
    with pytest.raises(AssertionError, match="would prove nothing"):
        assert_no_event("worker restarted, but the line carries no key\n", "worker_restarting")


def test_apply_overrides_sets_keys_merges_sections_and_replaces_the_rest() -> None:
    raw = {"workers": {"processes": 1, "lease": "10s"}, "region": "test"}
    apply_overrides(raw, {"workers__lease": "30s", "http": {"timeout": "1s"}, "region": "eu"})
    apply_overrides(raw, {"workers": {"processes": 2}})
    assert raw == {"workers": {"processes": 2, "lease": "30s"}, "http": {"timeout": "1s"}, "region": "eu"}


def test_wait_until_returns_the_value_or_fails_as_both_assertion_and_timeout() -> None:
    assert wait_until(lambda: 42, timeout=1) == 42
    with pytest.raises(WaitTimeout, match="waiting for nothing") as caught:
        wait_until(lambda: None, timeout=0, interval=0, message="nothing")
    assert isinstance(caught.value, AssertionError) and isinstance(caught.value, TimeoutError)


def test_replication_pair_fails_loudly_when_a_postgres_binary_is_missing(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    (tmp_path / "initdb").touch()
    monkeypatch.setattr(replication, "PG_BIN", tmp_path)
    with pytest.raises(ReplicationUnavailable, match="pg_ctl, pg_basebackup, postgres"):
        ReplicationPair()
