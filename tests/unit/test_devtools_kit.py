"""The shared dev-tools kit's own logic (no database, no subprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher_devtools.kit import (
    ReplicationPair,
    ReplicationUnavailable,
    SteadyProducer,
    WaitTimeout,
    apply_overrides,
    assert_no_event,
    config_for_test,
    log_events,
    replication,
    seeding,
    wait_until,
    write_config,
)
from dispatcher_devtools.kit.versions import RevisionUnavailable, export_revision

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


def test_steady_producer_counts_a_failure_that_is_not_a_database_error_and_goes_on(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A producer test asserts that no call failed: a failure of any kind must be counted, and
    must not end the thread silently (the test would then wait for events that never come)."""
    config = write_config(tmp_path / "c.yaml", config_for_test("postgresql://nobody@127.0.0.1:1/none"))
    calls: list[str] = []

    def refuse(*_args: object, **_kwargs: object) -> None:
        calls.append("connect")
        raise ValueError("refused by the test")

    monkeypatch.setattr(seeding.psycopg2, "connect", refuse)
    with SteadyProducer(config, "postgresql://nobody@127.0.0.1:1/none", "ws", pause=0.001) as producer:
        wait_until(lambda: len(producer.failures) >= 2, timeout=10, message="two counted failures")
    assert producer.failures[:2] == ["refused by the test"] * 2 and producer.committed == []


def test_export_revision_refuses_a_directory_without_history(tmp_path: Path) -> None:
    with pytest.raises(RevisionUnavailable, match="not a git checkout"):
        export_revision(tmp_path, "HEAD", tmp_path / "out")
