"""The supervisor, end to end: real processes, real signals, a real Postgres and receiver.

Every test runs ``python -m dispatcher.cli -c CONFIG run`` exactly as in
production (see ``dispatcher_devtools/kit/runner.py``) and acts on it from outside: it
signals the supervisor or a worker, watches ``webhook_deliveries`` and the log,
and counts what the receiver saw.  Timings in the configs are compressed; the
only time assertions are generous upper bounds (or a bound far below a lease
or grace period that would otherwise explain the result).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dispatcher.runtime.exitcodes import ExitCode
from dispatcher.runtime.heap import YOUNG_THRESHOLD
from dispatcher_devtools.kit import (
    REPO,
    SECRET,
    Dispatcher,
    SessionActivity,
    assert_no_event,
    produce,
    query,
    seed_workspace,
    status_counts,
    wait_until,
)
from dispatcher_devtools.receiver import ReceiverProcess

pytestmark = pytest.mark.timeout(90)

# The statement each worker's upkeep round starts with: take or renew the region's leader lease.
HOLD_LEADERSHIP = "INSERT INTO region_leader"
LEASED = "SELECT count(*) FROM webhook_deliveries WHERE locked_by IS NOT NULL"
# Rows that are pending but pushed into the future: a lease that was left to lapse.
DEFERRED = ("SELECT count(*) FROM webhook_deliveries "
            "WHERE status = 'pending' AND next_attempt_at > now() + interval '2 seconds'")
CLAIM_SESSIONS = ("SELECT pid FROM pg_stat_activity "
                  "WHERE datname = current_database() AND application_name LIKE 'dispatcher claim %%'")
DISPATCHER_SESSIONS = ("SELECT pid, application_name, state, extract(epoch FROM clock_timestamp() - state_change), "
                       "extract(epoch FROM clock_timestamp() - xact_start) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND application_name LIKE 'dispatcher%%'")


@pytest.fixture
def receiver() -> Iterator[ReceiverProcess]:
    with ReceiverProcess(secrets=[SECRET]) as rx:
        yield rx


@pytest.fixture
def make_config(db, write_config):  # type: ignore[no-untyped-def]
    """A config with compressed timings; ``workers``/``http``/... dicts are merged in."""

    def make(**overrides: Any) -> Path:
        sections: dict[str, dict[str, Any]] = {
            "workers": {"processes": 1, "poll_interval": "50ms", "heartbeat_interval": "200ms",
                        "graceful_timeout": "5s", "lease": "30s", "boot_timeout": "20s"},
            "http": {"require_https": False, "allow_private_networks": True, "timeout": "5s"},
            "database": {"dsn": db.dsn, "connect_timeout": "2s", "reconnect_max": "1s"},
            "alerts": {"check_interval": "200ms"},
        }
        plain: dict[str, Any] = {}
        for name, value in overrides.items():
            if isinstance(value, dict) and name in sections:
                sections[name] = {**sections[name], **value}
            else:
                plain[name] = value
        return write_config(db, **sections, **plain)  # type: ignore[no-any-return]

    return make


# --------------------------------------------------------------------------- helpers


def count(dsn: str, sql: str, params: Any = None) -> int:
    return int(query(dsn, sql, params)[0][0])


def owner_of(pid: int) -> str:
    """The ``--owner`` argument of a worker process (``host:supervisor_pid:wN``)."""
    cmdline = psutil.Process(pid).cmdline()
    return cmdline[cmdline.index("--owner") + 1]


def live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def workers_up(dispatcher: Dispatcher, n: int, timeout: float = 20.0) -> list[int]:
    """Wait until exactly ``n`` workers run and each has logged that it started serving."""

    def ready() -> list[int] | None:
        pids = [pid for pid in dispatcher.worker_pids() if live(pid)]
        if len(pids) != n:
            return None
        log = dispatcher.log()
        try:
            owners = [owner_of(pid) for pid in pids]
        except (psutil.NoSuchProcess, ValueError):
            return None
        return pids if all(f"worker {owner} started" in log for owner in owners) else None

    return sorted(wait_until(ready, timeout=timeout, interval=0.05, message=f"{n} booted worker(s)"))


def receiver_unique(receiver: ReceiverProcess) -> int:
    return sum(ep["unique"] for ep in receiver.stats()["endpoints"].values())


def no_traceback(log: str) -> None:
    assert "Traceback" not in log, log[-3000:]


def run_cli(config: Path, *args: str, pythonpath: str = str(REPO),
            timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``dispatcher -c CONFIG ARGS`` to completion, as the harness runs it (no DISPATCHER_* env)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "dispatcher.cli", "-c", str(config), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, check=False)


# --------------------------------------------------------------------------- TERM, INT


def test_term_drains_in_flight_sends_and_exits_0(
        db, make_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    # Per-endpoint concurrency is region-wide (docs/claim.md): a claim takes only the
    # slots no lease holds, so every claimed row has a sender at once and none waits in
    # a lane queue.  At TERM the rows claimed are the sends in flight; they must finish
    # within the grace period and be recorded, and nothing may be left leased or deferred.
    keys = ["a", "b", "c"]
    seed_workspace(db.dsn, "ws", [receiver.url("latency", key, ms=800, median_ms=600, sigma=0.5) for key in keys])
    config = make_config(workers={"processes": 2})
    produce(config, db.dsn, "ws", 20)
    rows = 60

    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        workers_up(dispatcher, 2)
        wait_until(lambda: status_counts(db.dsn).get("delivered", 0) >= 3, message="deliveries to flow")
        wait_until(lambda: sum(ep["in_flight"] for ep in receiver.stats(fast=True)["endpoints"].values()) >= 3,
                   interval=0.02, message="sends in flight")
        dispatcher.signal(signal.SIGTERM)
        assert dispatcher.wait(20) == ExitCode.OK
        log = dispatcher.log()
    assert "TERM: graceful shutdown" in log
    assert count(db.dsn, LEASED) == 0, "a leased row outlived the shutdown"
    assert count(db.dsn, DEFERRED) == 0, "unsent rows were left to lapse instead of handed back"
    first_run = status_counts(db.dsn)
    # Sends in flight at TERM finished within the grace period and were recorded.
    assert first_run.get("delivered", 0) >= 1 and sum(first_run.values()) == rows
    assert set(first_run) <= {"delivered", "pending"}
    assert_no_event(log, "grace_period_over", control="worker_started")
    no_traceback(log)

    for key in keys:
        receiver.set_profile(key, "ok")
    with Dispatcher(config, tmp_path / "d2.log"):
        wait_until(lambda: status_counts(db.dsn) == {"delivered": rows}, message=f"all {rows} rows delivered")
    stats = receiver.stats()
    assert receiver_unique(receiver) == rows
    assert stats["duplicates"] == 0, "a graceful drain never sends a row twice"


def test_term_past_the_grace_period_releases_rows_still_in_flight(
        db, make_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("latency", f"s{n}", ms=6000) for n in range(3)])
    config = make_config(workers={"graceful_timeout": "1s"}, http={"timeout": "8s"})
    produce(config, db.dsn, "ws", 10)
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        wait_until(lambda: receiver.stats(fast=True)["total"] >= 12, message="12 sends in flight")
        started = time.monotonic()
        dispatcher.signal(signal.SIGTERM)
        assert dispatcher.wait(20) == ExitCode.OK
        took = time.monotonic() - started
        log = dispatcher.log()
    assert took < 5.5, f"TERM took {took:.1f}s, though the in-flight sends needed 6s"
    assert "grace period over with" in log
    assert count(db.dsn, LEASED) == 0
    assert count(db.dsn, DEFERRED) == 0, "rows in flight at the end of the grace period were left to lapse"
    assert status_counts(db.dsn) == {"pending": 30}
    no_traceback(log)

    for n in range(3):
        receiver.set_profile(f"s{n}", "ok")
    with Dispatcher(config, tmp_path / "d2.log"):
        wait_until(lambda: status_counts(db.dsn) == {"delivered": 30}, message="all 30 rows delivered")
    assert receiver_unique(receiver) == 30


def test_int_is_a_fast_shutdown_that_releases_leases(db, make_config, tmp_path: Path,
                                                     receiver: ReceiverProcess) -> None:
    # Answers take 60 s (within the 90 s deadline), so no send ends, and none times out, before the
    # INT.  Eight endpoints: with held lanes a worker takes at most its share (2) of an endpoint's 4
    # slots, so either worker alone can have 16 sends in flight, however late the other boots.
    seed_workspace(db.dsn, "ws", [receiver.url("latency", f"s{n}", ms=60000) for n in range(8)])
    config = make_config(workers={"processes": 2, "graceful_timeout": "20s", "lease": "200s"},
                         http={"timeout": "90s"})
    produce(config, db.dsn, "ws", 10)
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        pids = workers_up(dispatcher, 2)
        wait_until(lambda: receiver.stats(fast=True)["total"] >= 16, message="sends in flight")
        assert count(db.dsn, LEASED) >= 16
        started = time.monotonic()
        dispatcher.signal(signal.SIGINT)
        assert dispatcher.wait(20) == ExitCode.OK
        took = time.monotonic() - started
        log = dispatcher.log()
        assert not [pid for pid in pids if live(pid)], "a worker outlived the supervisor"
    assert took < 5.0, f"INT took {took:.1f}s; it must not wait for the 20s grace period"
    assert "SIGINT: fast shutdown" in log
    assert count(db.dsn, LEASED) == 0, "fast shutdown left leases behind"
    assert count(db.dsn, DEFERRED) == 0
    assert status_counts(db.dsn) == {"pending": 80}


def test_worker_names_are_not_reused_by_a_supervisor_with_the_same_pid(make_config) -> None:
    # A released name stays retired, and fences out every claim made in it (migration 0029): a
    # supervisor given a dead one's pid must still name its workers afresh.
    from dispatcher.config import load_config
    from dispatcher.runtime.supervisor import Supervisor

    config = load_config(make_config())
    first, second = Supervisor(config, config.database.dsn), Supervisor(config, config.database.dsn)
    try:
        names = {first._owner(1), second._owner(1)}
    finally:
        first._cleanup()
        second._cleanup()
    assert len(names) == 2
    assert all(name.split(":")[1] == str(os.getpid()) and name.endswith(":w1") for name in names)


# --------------------------------------------------------------------------- crashes and health


def test_sigkill_of_a_worker_holding_200_rows_loses_nothing(db, make_config, tmp_path: Path,
                                                           receiver: ReceiverProcess) -> None:
    # 60 endpoints (a workspace may have 10), 4 sends in flight to each: 240 rows held.
    keys = [f"e{n}" for n in range(60)]
    config = make_config(workers={"processes": 1, "max_in_flight": 512, "claim_batch": 200,
                                  "per_endpoint_concurrency": 4, "lease": "60s"})
    events = 5
    rows = events * len(keys)
    for w in range(6):
        seed_workspace(db.dsn, f"ws{w}", [receiver.url("latency", key, ms=3000) for key in keys[w * 10:w * 10 + 10]])
        produce(config, db.dsn, f"ws{w}", events)
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        (victim,) = workers_up(dispatcher, 1)
        wait_until(lambda: count(db.dsn, LEASED) >= 200, message=">= 200 claimed rows")
        wait_until(lambda: receiver.stats(fast=True)["total"] >= 200, message=">= 200 sends in flight")
        (owner,), = query(db.dsn, "SELECT DISTINCT locked_by FROM webhook_deliveries WHERE locked_by IS NOT NULL")
        assert owner == owner_of(victim)
        held = count(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE locked_by = %s", (owner,))
        assert held >= 200

        killed = time.monotonic()
        psutil.Process(victim).send_signal(signal.SIGKILL)
        wait_until(lambda: count(db.dsn, "SELECT count(*) FROM webhook_deliveries "
                                         "WHERE status = 'pending' AND locked_by = %s", (owner,)) == 0,
                   timeout=15, message="the dead owner's rows to be released")
        released_after = time.monotonic() - killed
        assert released_after < 15, "released by the supervisor, not by the 60s lease lapsing"
        for key in keys:
            receiver.set_profile(key, "ok")
        (replacement,) = workers_up(dispatcher, 1)
        assert replacement != victim
        wait_until(lambda: status_counts(db.dsn) == {"delivered": rows}, timeout=40,
                   message=f"all {rows} rows delivered")
    # Read once the supervisor has exited: every process has written its last line.
    log = dispatcher.log()
    assert re.search(rf"released (\d+) rows claimed by {re.escape(owner)}", log)
    assert re.search(rf"worker {re.escape(owner)} exited with -9 .* restarting in", log)
    stats = receiver.stats()
    assert stats["bad_signatures"] == 0
    per_endpoint = stats["endpoints"]
    assert {key: per_endpoint[key]["unique"] for key in keys} == {key: events for key in keys}
    # The receiver counts by webhook-id: a resend with a new id would raise unique above `rows`.
    assert receiver_unique(receiver) == rows
    assert stats["duplicates"] >= 1, "the killed worker's in-flight sends were resent"
    assert sum(ep["idempotency_key_mismatch"] for ep in per_endpoint.values()) == 0


def test_a_stuck_worker_is_killed_and_replaced(db, make_config, tmp_path: Path) -> None:
    config = make_config(workers={"heartbeat_timeout": "2s"})
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        (stuck,) = workers_up(dispatcher, 1)
        owner = owner_of(stuck)
        psutil.Process(stuck).send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: stuck not in dispatcher.worker_pids(), message="the stopped worker to be reaped")
            (replacement,) = workers_up(dispatcher, 1)
        finally:
            if live(stuck):
                psutil.Process(stuck).send_signal(signal.SIGCONT)
        assert replacement != stuck
    log = dispatcher.log()
    assert f"worker {owner} missed its heartbeat" in log


def test_a_crashed_worker_is_restarted_with_growing_backoff(db, make_config, tmp_path: Path) -> None:
    config = make_config()
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        seen = workers_up(dispatcher, 1)
        for _ in range(2):
            victim = seen[-1]
            psutil.Process(victim).send_signal(signal.SIGKILL)
            wait_until(lambda v=victim: dispatcher.worker_pids() and v not in dispatcher.worker_pids(),
                       message="a replacement worker")
            seen += workers_up(dispatcher, 1)
        assert len(set(seen)) == 3
        assert dispatcher.process is not None and dispatcher.process.poll() is None
    log = dispatcher.log()
    delays = [float(d) for d in re.findall(r"exited with -9 after [\d.]+s; restarting in ([\d.]+)s", log)]
    assert len(delays) == 2 and delays[1] > delays[0], log


def test_claims_are_released_at_once_even_after_the_supervisors_db_session_dropped(
        db, make_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    """The supervisor's session idles between crashes; a dropped one must not delay the release."""
    seed_workspace(db.dsn, "ws", [receiver.url("latency", f"s{n}", ms=3000) for n in range(3)])
    config = make_config(workers={"lease": "60s"})
    supervisor_session = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                          "AND application_name = 'dispatcher supervisor'")
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        (first,) = workers_up(dispatcher, 1)
        psutil.Process(first).send_signal(signal.SIGKILL)  # its reap opens the supervisor's session
        wait_until(lambda: query(db.dsn, supervisor_session), message="the supervisor's session")
        wait_until(lambda: first not in dispatcher.worker_pids(), message="the first worker to be reaped")
        (second,) = workers_up(dispatcher, 1)
        owner = owner_of(second)
        produce(config, db.dsn, "ws", 5)
        wait_until(lambda: count(db.dsn, LEASED) >= 12, message="rows to be claimed")

        query(db.dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND application_name = 'dispatcher supervisor'")
        wait_until(lambda: not query(db.dsn, supervisor_session), message="the supervisor's session to drop")
        psutil.Process(second).send_signal(signal.SIGKILL)
        wait_until(lambda: count(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE locked_by = %s",
                                 (owner,)) == 0, timeout=15, message="the dead owner's rows to be released")
        dispatcher.signal(signal.SIGINT)
        assert dispatcher.wait(20) == ExitCode.OK
        log = dispatcher.log()
    assert re.search(rf"released \d+ rows claimed by {re.escape(owner)}", log), log[-3000:]
    assert_no_event(log, "release_failed")


def test_a_release_the_database_never_answers_does_not_hold_up_the_supervisor(
        db, make_config, tmp_path: Path) -> None:
    """The supervisor's release of a dead worker's claims waits on a lock here, as it would on a
    frozen primary or a host gone silent; it gives up after database.statement_deadline, and the
    supervisor goes on replacing workers and obeying signals (the lease lapses instead)."""
    import psycopg2

    config = make_config(database={"statement_deadline": "2s"})
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        (first,) = workers_up(dispatcher, 1)
        owner = owner_of(first)
        locker = psycopg2.connect(db.dsn)
        try:
            with locker.cursor() as cur:
                cur.execute("LOCK TABLE region_leader IN ACCESS EXCLUSIVE MODE")
            psutil.Process(first).send_signal(signal.SIGKILL)
            wait_until(lambda: first not in dispatcher.worker_pids(), message="the killed worker to be reaped")
            (second,) = workers_up(dispatcher, 1)
            assert second != first
            dispatcher.signal(signal.SIGTERM)
            assert dispatcher.wait(30) == ExitCode.OK
        finally:
            locker.rollback()
            locker.close()
        log = dispatcher.log()
    assert f"could not release {owner}'s claims now" in log, log[-3000:]
    assert "Traceback" not in log


def test_workers_boot_from_the_config_the_supervisor_runs_not_the_file(db, make_config, tmp_path: Path) -> None:
    # A worker that cannot boot halts the supervisor (the next test).  Taking the file away once the
    # supervisor has read it is not such a failure any more: workers boot from the supervisor's copy
    # of the config it runs, as a crashed worker's replacement does after a failed HUP.
    config = make_config(workers={"processes": 2})
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        # The supervisor has passed its boot checks and waits ~0.5s before its first spawn.
        wait_until(lambda: "supervisor pid" in dispatcher.log(), interval=0.005, message="the supervisor to start")
        config.unlink()
        workers_up(dispatcher, 2)
        assert dispatcher.process is not None and dispatcher.process.poll() is None
        log = dispatcher.log()
    assert "boot failed" not in log and "halting" not in log
    assert log.count("spawned worker") == 2


def test_each_worker_freezes_its_boot_heap_before_serving(db, make_config, tmp_path: Path) -> None:
    # dispatcher.runtime.heap: a worker's collector is settled once boot is done, before its
    # first claim, in the worker's own process (what the line reports is read from its gc).
    with Dispatcher(make_config(workers={"processes": 2}), tmp_path / "d.log") as dispatcher:
        pids = workers_up(dispatcher, 2)
        owners = {owner_of(pid) for pid in pids}
        log = dispatcher.log()
    settled = {found[1]: (int(found[2]), found[3]) for found in re.finditer(
        r"worker (\S+) heap settled: (\d+) boot objects frozen, collector thresholds (\S+) event=heap_settled", log)}
    assert set(settled) == owners
    for owner, (frozen, thresholds) in settled.items():
        assert frozen > 10_000, (owner, frozen)
        assert thresholds.split("/")[0] == str(YOUNG_THRESHOLD)
        assert log.index(f"worker {owner} heap settled") < log.index(f"worker {owner} started")


def test_a_broken_worker_install_halts_instead_of_crash_looping(db, make_config, tmp_path: Path) -> None:
    """A worker that dies before it is ready -- here, a dependency that fails to import in the
    worker only -- is a boot failure (exit 4), not a crash to restart with backoff forever."""
    broken = tmp_path / "broken" / "psycogreen"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('psycogreen is broken in this install')\n")
    try:
        result = run_cli(make_config(), "run", pythonpath=f"{broken.parent}{os.pathsep}{REPO}")
    except subprocess.TimeoutExpired as exc:
        output = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        raise AssertionError(f"the supervisor kept restarting a worker that cannot boot:\n{output}") from None
    assert result.returncode == ExitCode.WORKER_BOOT_FAILED, result.stderr[-3000:]
    assert "boot failed: cannot set up gevent: ImportError: psycogreen is broken" in result.stderr
    assert "failed to boot; halting instead of crash-looping" in result.stderr
    assert result.stderr.count("spawned worker") == 1
    assert_no_event(result.stderr, "worker_restarting")
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------- boot checks


def test_boot_checks_name_the_problem_with_an_exit_code(db, empty_db, make_config, write_config,
                                                        tmp_path: Path) -> None:
    unreachable = run_cli(make_config(database={"dsn": "postgresql://postgres@127.0.0.1:1/x"}), "run")
    assert unreachable.returncode == ExitCode.DATABASE_UNAVAILABLE, unreachable.stderr
    assert unreachable.stderr.strip().count("\n") == 0, unreachable.stderr
    assert unreachable.stderr.startswith("dispatcher: cannot connect to the database")
    assert "Traceback" not in unreachable.stderr

    unmigrated = run_cli(write_config(empty_db), "run")
    assert unmigrated.returncode == ExitCode.SCHEMA_OUTDATED, unmigrated.stderr
    assert "migrate" in unmigrated.stderr and "Traceback" not in unmigrated.stderr

    bad = run_cli(make_config(workers={"processes": 0}), "run")
    assert bad.returncode == ExitCode.CONFIG, bad.stderr
    assert "workers.processes" in bad.stderr and "Traceback" not in bad.stderr

    missing = run_cli(tmp_path / "no-such.yaml", "run")
    assert missing.returncode == ExitCode.CONFIG and "cannot read config file" in missing.stderr


# --------------------------------------------------------------------------- HUP, TTIN, TTOU


def test_hup_reloads_the_config_and_replaces_workers(db, make_config, tmp_path: Path) -> None:
    config = make_config(workers={"processes": 1})
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        (original,) = workers_up(dispatcher, 1)
        good = config.read_text()

        config.write_text("workers: [this is: not valid\n")
        dispatcher.signal(signal.SIGHUP)
        wait_until(lambda: "HUP: config not reloaded" in dispatcher.log(), message="the reload error")
        # TTIN is handled after the failed HUP, and its spawn (in that pass or a later one)
        # would also replace a worker the HUP had retired: once it is up, nothing was replaced.
        # The file is still broken: a worker spawned now runs the config the supervisor runs
        # (as a crashed worker's replacement does), not whatever the file holds.
        dispatcher.signal(signal.SIGTTIN)
        pair = workers_up(dispatcher, 2)
        assert original in pair, "the failed reload replaced the running worker"
        assert dispatcher.log().count("spawned worker") == 2
        assert dispatcher.process is not None and dispatcher.process.poll() is None

        config.write_text(make_config(workers={"processes": 3}).read_text())
        assert config.read_text() != good
        dispatcher.signal(signal.SIGHUP)
        replaced = workers_up(dispatcher, 3)
        assert not set(pair) & set(replaced)
        wait_until(lambda: not any(live(pid) for pid in pair), message="the old workers to exit")
    log = dispatcher.log()
    assert "HUP: config reloaded" in log
    assert_no_event(log, "worker_restarting")  # a retired worker is not a crash


def test_hup_lets_retiring_workers_finish_their_sends(db, make_config, tmp_path: Path,
                                                     receiver: ReceiverProcess) -> None:
    """A retiring worker stops heartbeating while it drains: it has the grace period, and is
    not killed as stuck after heartbeat_timeout (which would abort and resend its sends)."""
    seed_workspace(db.dsn, "ws", [receiver.url("latency", f"s{n}", ms=3500) for n in range(3)])
    config = make_config(workers={"heartbeat_timeout": "2s", "graceful_timeout": "10s"}, http={"timeout": "6s"})
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        (original,) = workers_up(dispatcher, 1)
        owner = owner_of(original)
        produce(config, db.dsn, "ws", 4)
        wait_until(lambda: receiver.stats(fast=True)["total"] >= 12, message="12 slow sends in flight")
        dispatcher.signal(signal.SIGHUP)
        wait_until(lambda: status_counts(db.dsn) == {"delivered": 12}, timeout=30, message="all 12 rows delivered")
        wait_until(lambda: not live(original), message="the retired worker to exit")
    log = dispatcher.log()
    assert f"worker {owner} stopped" in log
    assert_no_event(log, "heartbeat_missed")
    assert receiver.stats()["duplicates"] == 0, "the retiring worker's sends were cut off and resent"


def test_ttin_adds_and_ttou_removes_a_worker(db, make_config, tmp_path: Path) -> None:
    with Dispatcher(make_config(workers={"processes": 1}), tmp_path / "d.log") as dispatcher:
        (first,) = workers_up(dispatcher, 1)
        dispatcher.signal(signal.SIGTTIN)
        two = workers_up(dispatcher, 2)
        assert first in two
        dispatcher.signal(signal.SIGTTOU)
        (left,) = workers_up(dispatcher, 1)
        wait_until(lambda: sum(live(pid) for pid in two) == 1, message="one worker to retire")
    log = dispatcher.log()
    assert left in two
    assert "TTIN: 2 worker(s)" in log and "TTOU: 1 worker(s)" in log
    assert_no_event(log, "worker_restarting")


# --------------------------------------------------------------------------- the database


def test_database_blips_are_survived_without_losing_rows(db, make_config, tmp_path: Path,
                                                         receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("latency", f"b{n}", ms=300) for n in range(2)])
    # The shortest lease allowed: a claim whose commit reply a blip swallowed lapses soon.
    config = make_config(workers={"processes": 2, "lease": "11s"})
    rows = 2 * 80
    produce(config, db.dsn, "ws", 80)
    # The pids of the dispatcher sessions it terminated (OFFSET 0 keeps the filter before the kill).
    terminate = ("SELECT pid FROM (SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                 "AND application_name LIKE 'dispatcher%%' OFFSET 0) s WHERE pg_terminate_backend(pid)")
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        pids = workers_up(dispatcher, 2)
        wait_until(lambda: status_counts(db.dsn).get("delivered", 0) >= 10, message="deliveries to flow")
        killed: set[int] = set()

        def reconnected() -> set[int]:
            return {pid for pid, in query(db.dsn, CLAIM_SESSIONS)} - killed

        for blip in range(3):
            # Each blip waits for a claim session opened since the last one: it hits a dispatcher that reconnected.
            wait_until(reconnected, message=f"a claim session reconnected before blip {blip + 1}")
            killed |= {pid for pid, in query(db.dsn, terminate)}
        assert len(killed) >= 3, "the blips hit dispatcher sessions"
        wait_until(lambda: status_counts(db.dsn) == {"delivered": rows}, timeout=45,
                   message=f"all {rows} rows delivered")
        assert sorted(dispatcher.worker_pids()) == pids, "no worker died for a database blip"
    log = dispatcher.log()
    assert re.search(r"WARNING .*(backing off|will retry|upkeep skipped)", log), log[-3000:]
    no_traceback(log)
    assert receiver_unique(receiver) == rows


def test_no_transaction_is_held_open_across_http(db, make_config, tmp_path: Path,
                                                 receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("latency", f"s{n}", ms=2000) for n in range(10)])
    config = make_config()
    produce(config, db.dsn, "ws", 8)
    samples: list[tuple[Any, ...]] = []
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: receiver.stats(fast=True)["total"] >= 30, message="slow sends in flight")

        def sampled_a_wave() -> bool:
            # Sample until 20 of the slow sends were recorded (each held 2 s of HTTP), so the
            # samples span claims, sends and records.  Counted before the sample: the result
            # connection opens at the first flush, and one flush can record all 20 between a
            # sample and the count after it; the last sample then still sees that connection.
            recorded = status_counts(db.dsn).get("delivered", 0) >= 20
            samples.extend(query(db.dsn, DISPATCHER_SESSIONS))
            return recorded

        wait_until(sampled_a_wave, interval=0.01, message="20 slow sends recorded while sampling")
    assert {name.split()[1] for _, name, *_ in samples} >= {"claim", "record"}, "dispatcher sessions were seen"
    # A transaction held across a 2s POST would sit 'idle in transaction' for
    # up to 2s.  The one unavoidable sliver is between a statement's result and
    # its COMMIT (microseconds), so only a sliver older than 0.5s counts.
    held = [s for s in samples if s[2] and s[2].startswith("idle in transaction") and s[3] > 0.5]
    assert not held, held
    old = [s for s in samples if s[4] is not None and s[4] > 1.0]
    assert not old, f"a dispatcher transaction stayed open over 1s: {old}"


def _upkeep_leaders(log: str) -> list[str]:
    return re.findall(r"\[([^\]]+)\] dispatcher\.upkeep this process now runs region upkeep", log)


def _lease_holders(dsn: str) -> list[str]:
    """Owners of an unexpired region leader lease (a row, so it holds behind a transaction pooler too)."""
    return [row[0] for row in query(dsn, "SELECT owner FROM region_leader WHERE until > now()")]


def test_exactly_one_process_runs_region_upkeep_and_another_takes_over(db, make_config, tmp_path: Path) -> None:
    config = make_config(workers={"processes": 2})
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        pids = workers_up(dispatcher, 2)
        (leader_owner,) = wait_until(lambda: _upkeep_leaders(dispatcher.log()), message="an upkeep leader")
        (leader,) = [pid for pid in pids if owner_of(pid) == leader_owner]
        (other,) = [owner_of(pid) for pid in pids if pid != leader]
        # The other worker tries for the lease five more times; only then may it not have won.
        SessionActivity(db.dsn, "upkeep", HOLD_LEADERSHIP, owner=other).wait_for(5)
        assert _upkeep_leaders(dispatcher.log()) == [leader_owner]
        assert _lease_holders(db.dsn) == [leader_owner]

        psutil.Process(leader).send_signal(signal.SIGKILL)
        leaders = wait_until(lambda: (found := _upkeep_leaders(dispatcher.log()))[1:] and found,
                             message="another process to take over upkeep")
        assert len(leaders) == 2 and leaders[1] != leader_owner
        assert _lease_holders(db.dsn) == [leaders[1]]
