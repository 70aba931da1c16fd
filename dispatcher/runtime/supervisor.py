"""The supervisor: one worker process per core, kept alive (gunicorn's arbiter).

Signal handlers only queue the signal and wake the main loop; the loop acts:

* TERM: graceful -- workers stop claiming, finish in-flight sends within the
  grace period and hand unsent rows back; then exit 0.
* INT, QUIT: fast -- workers exit at once; their leases are released here.
* HUP: reload the config file and replace every worker.  A file that fails to load is
  refused; workers always boot from the supervisor's copy of the config it runs.
* TTIN / TTOU: one worker more / fewer.

Workers are started with fork+exec (``python -m dispatcher.runtime.worker_main``)
rather than a bare fork, so each one monkey-patches in a fresh interpreter
before anything imports ``socket``/``ssl``/``threading``, and gets a fresh hub,
its own database connections and its own connection pools.

Health: every worker touches its heartbeat file; one that stays silent past
``workers.heartbeat_timeout`` is killed and replaced.  A worker that dies
after booting is restarted with backoff and the rows it had claimed are
released at once.  A worker that fails to *boot* (exit code
WORKER_BOOT_FAILED) halts the supervisor: that is a deployment problem, and a
crash loop would only hide it.
"""

from __future__ import annotations

import logging
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dispatcher import store
from dispatcher.config import WORKER_DSN_ENV, Config, ConfigError, config_from_text, read_config_text
from dispatcher.rules.backoff import Backoff
from dispatcher.runtime.deadline import blocking_bound, install_bounded_waits
from dispatcher.runtime.embedded import resolve_dsn
from dispatcher.runtime.entry import check_schema
from dispatcher.runtime.exitcodes import ExitCode
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher.store.operations import record_stop

log = logging.getLogger("dispatcher.supervisor")

# Loud on purpose: an operator who set dry_run expecting "send nothing" must
# learn that live rows are sent (docs/decisions.md, Dry run).
DRY_RUN_WARNING = ("dry_run is on: mode='shadow' rows are marked shadow (done, never delivered) without a POST; "
                   "mode='live' rows are still sent normally (dry run never skips a live row)")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP,
                   signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD)
# The wait before restarting a worker that crashed (the n-th time in a row):
# 0.5 s, doubling, at most 30 s; no jitter, there is one supervisor.
RESTART_BACKOFF = Backoff(base=0.5, cap=30.0)
STABLE_AFTER = 60.0


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    owner: str
    heartbeat: Path
    started: float = field(default_factory=time.monotonic)
    retiring: bool = False
    retired_at: float = 0.0

    def is_ready(self) -> bool:
        try:
            return self.heartbeat.stat().st_size > 0
        except OSError:
            return False

    def silent_for(self) -> float:
        try:
            return time.time() - self.heartbeat.stat().st_mtime
        except OSError:
            return float("inf")


class Supervisor:
    def __init__(self, config: Config, dsn: str) -> None:
        self.config = config
        self.dsn = dsn
        self.target = config.workers.processes
        self.workers: list[WorkerProcess] = []
        self._signals: list[int] = []
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        # Workers boot from a copy of the config the supervisor runs, never from the file
        # itself: a file broken (or edited without a HUP) after start must not reach a worker
        # spawned later by TTIN or after a crash, as gunicorn's arbiter keeps its config.
        text = read_config_text(config.source)
        if config_from_text(text, source=config.source) != config:
            raise ConfigError(f"config file {config.source} changed while the dispatcher started; start it again")
        self._dir = Path(tempfile.mkdtemp(prefix="dispatcher-heartbeats-"))
        self._running_config = self._dir / "config.yaml"
        self._keep_running_config(text)
        self._spawned = 0
        # A random part in every worker's name: a supervisor given the pid of one that died must
        # not reuse its workers' names, which stay retired for a day after release (migration 0029).
        self._name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._crashes = 0
        self._next_spawn_at = 0.0
        # Each wait for the database is bounded (runtime/deadline.py, installed by
        # run_supervisor): a release that never gets an answer must not stop the loop.
        self._connection = ManagedConnection(dsn, "dispatcher supervisor", config.database.connect_timeout,
                                             config.database.prepared_statements, bound=blocking_bound,
                                             statement_deadline=config.database.statement_deadline)
        self._leases = EngineStore(self._connection)

    # -- signals: the handler only queues -----------------------------------

    def _queue_signal(self, signum: int, frame: object) -> None:
        # SIGCHLD only needs to wake the loop (it reaps every pass); queueing
        # it could crowd a TERM out of the bounded queue during a burst.
        if signum != signal.SIGCHLD and len(self._signals) < 16:
            self._signals.append(signum)
        try:
            os.write(self._wake_write, b".")
        except BlockingIOError:
            pass

    def _install_signals(self) -> None:
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, self._queue_signal)

    def _sleep(self, seconds: float) -> None:
        ready, _, _ = select.select([self._wake_read], [], [], seconds)
        if ready:
            try:
                while os.read(self._wake_read, 512):
                    pass
            except BlockingIOError:
                pass

    # -- main loop ----------------------------------------------------------

    def run(self) -> int:
        self._install_signals()
        log.info("supervisor pid %d starting %d worker(s) for region %s event=supervisor_started", os.getpid(),
                 self.target, self.config.region)
        if self.config.dry_run:
            log.warning(DRY_RUN_WARNING)
        try:
            while True:
                self._sleep(0.5)
                while self._signals:
                    code = self._handle(self._signals.pop(0))
                    if code is not None:
                        return code
                halt = self._reap()
                if halt is not None:
                    self._stop(graceful=False, how=f"halted with exit code {halt}: workers could not run")
                    return halt
                self._kill_stuck()
                self._spawn_missing()
        finally:
            self._cleanup()

    def _handle(self, signum: int) -> int | None:
        if signum == signal.SIGTERM:
            log.info("TERM: graceful shutdown")
            self._stop(graceful=True, how="TERM: graceful shutdown")
            return ExitCode.OK
        if signum in (signal.SIGINT, signal.SIGQUIT):
            log.info("%s: fast shutdown", signal.Signals(signum).name)
            self._stop(graceful=False, how=f"{signal.Signals(signum).name[3:]}: fast shutdown")
            return ExitCode.OK
        if signum == signal.SIGHUP:
            self._reload()
        elif signum == signal.SIGTTIN:
            self.target += 1
            log.info("TTIN: %d worker(s)", self.target)
        elif signum == signal.SIGTTOU and self.target > 1:
            self.target -= 1
            log.info("TTOU: %d worker(s)", self.target)
            self._retire(self._active()[: len(self._active()) - self.target])
        return None

    def _reload(self) -> None:
        try:
            text = read_config_text(self.config.source)
            config = config_from_text(text, source=self.config.source)
        except ConfigError as exc:
            log.error("HUP: config not reloaded, keeping the running one: %s", exc)
            return
        self._keep_running_config(text)
        log.info("HUP: config reloaded from %s; replacing workers", config.source)
        self.config = config
        self.target = config.workers.processes
        self._retire(self._active())

    def _keep_running_config(self, text: str) -> None:
        """Write the running config's ``text`` as the copy workers boot from."""
        staged = self._running_config.with_suffix(".new")
        staged.write_text(text, encoding="utf-8")  # in the supervisor's own 0700 directory
        os.replace(staged, self._running_config)

    def _active(self) -> list[WorkerProcess]:
        return [w for w in self.workers if not w.retiring]

    def _retire(self, workers: list[WorkerProcess]) -> None:
        for worker in workers:
            worker.retiring = True
            worker.retired_at = time.monotonic()
            self._signal(worker, signal.SIGTERM)

    # -- spawning and reaping -----------------------------------------------

    def _spawn_missing(self) -> None:
        while len(self._active()) < self.target and time.monotonic() >= self._next_spawn_at:
            self.workers.append(self._spawn())

    def _spawn(self) -> WorkerProcess:
        self._spawned += 1
        owner = self._owner(self._spawned)
        heartbeat = self._dir / f"w{self._spawned}"
        heartbeat.write_bytes(b"")
        env = dict(os.environ, **{WORKER_DSN_ENV: self.dsn})
        command = [sys.executable, "-m", "dispatcher.runtime.worker_main", "--config", str(self._running_config),
                   "--source", self.config.source, "--owner", owner, "--heartbeat", str(heartbeat)]
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        log.info("spawned worker %s (pid %d)", owner, process.pid)
        return WorkerProcess(process, owner, heartbeat)

    def _owner(self, n: int) -> str:
        """The name of the n-th worker spawned: what ``locked_by`` and lane entries hold."""
        return f"{self._name}:w{n}"

    def _reap(self) -> int | None:
        for worker in list(self.workers):
            code = worker.process.poll()
            if code is None:
                continue
            self.workers.remove(worker)
            worker.heartbeat.unlink(missing_ok=True)
            self._release(worker)
            if code == ExitCode.WORKER_BOOT_FAILED:
                log.error("worker %s failed to boot; halting instead of crash-looping", worker.owner)
                return ExitCode.WORKER_BOOT_FAILED
            if not worker.retiring:
                self._after_crash(worker, code)
        return None

    def _after_crash(self, worker: WorkerProcess, code: int) -> None:
        lived = time.monotonic() - worker.started
        self._crashes = 1 if lived > STABLE_AFTER else self._crashes + 1
        delay = RESTART_BACKOFF.delay(self._crashes, 0.0)
        self._next_spawn_at = time.monotonic() + delay
        log.warning("worker %s exited with %s after %.1fs; restarting in %.1fs event=worker_restarting",
                    worker.owner, code, lived, delay)

    def _release(self, worker: WorkerProcess) -> None:
        # The supervisor's session idles between crashes, for days maybe, so
        # finding it dropped (server restart, idle timeout, failover) is normal:
        # the first failure gets one retry on a fresh connection.
        for last_try in (False, True):
            try:
                released = self._leases.release_owner(worker.owner)
                break
            except store.DatabaseUnavailable as exc:
                if last_try:
                    log.warning("could not release %s's claims now (their lease will lapse): %s event=release_failed",
                                worker.owner, exc)
                    return
        if released:
            log.info("released %d rows claimed by %s", released, worker.owner)

    def _kill_stuck(self) -> None:
        timeouts = self.config.workers
        for worker in self.workers:
            if worker.retiring:
                # A draining worker stops heartbeating; like on TERM, it has the
                # grace period to finish its in-flight sends before it is killed.
                if time.monotonic() - worker.retired_at > timeouts.graceful_timeout + 5.0:
                    log.error("worker %s did not finish draining within %.0fs; killing it", worker.owner,
                              timeouts.graceful_timeout + 5.0)
                    self._signal(worker, signal.SIGKILL)
            elif not worker.is_ready():
                if time.monotonic() - worker.started > timeouts.boot_timeout:
                    log.error("worker %s did not boot within %.0fs; killing it", worker.owner, timeouts.boot_timeout)
                    self._signal(worker, signal.SIGKILL)
            elif worker.silent_for() > timeouts.heartbeat_timeout:
                log.error("worker %s missed its heartbeat for %.0fs; killing it event=heartbeat_missed", worker.owner,
                          worker.silent_for())
                self._signal(worker, signal.SIGKILL)

    def _signal(self, worker: WorkerProcess, signum: int) -> None:
        try:
            worker.process.send_signal(signum)
        except ProcessLookupError:
            pass

    # -- shutdown -----------------------------------------------------------

    def _stop(self, graceful: bool, how: str) -> None:
        for worker in self.workers:
            self._signal(worker, signal.SIGTERM if graceful else signal.SIGQUIT)
        grace = self.config.workers.graceful_timeout + 5.0 if graceful else 3.0
        deadline = time.monotonic() + grace
        while self.workers and time.monotonic() < deadline:
            self._sleep(0.1)
            self._reap_quietly()
        for worker in self.workers:
            log.warning("worker %s did not stop in time; killing it", worker.owner)
            self._signal(worker, signal.SIGKILL)
            worker.process.wait()
            self._release(worker)
        self.workers.clear()
        self._record_stop(how)

    def _record_stop(self, how: str) -> None:
        """Tell status how the fleet stopped: without it, a region whose workers had all left cleanly looked
        as if none had ever run.  Best effort: a database that is gone costs the record, not the stop."""
        host, pid = socket.gethostname(), os.getpid()
        owners = [self._owner(n) for n in range(1, self._spawned + 1)]
        try:
            record_stop(self._connection, self.config.region, owners, how, host, pid)
        except Exception as exc:  # a StoreError or a bounded wait's timeout: the stop goes on
            log.warning("could not record this stop for status: %s event=stop_not_recorded", exc)

    def _reap_quietly(self) -> None:
        for worker in list(self.workers):
            if worker.process.poll() is not None:
                self.workers.remove(worker)
                self._release(worker)

    def _cleanup(self) -> None:
        self._connection.close()
        for path in self._dir.glob("*"):
            path.unlink(missing_ok=True)
        self._dir.rmdir()


def run_supervisor(config: Config) -> int:
    """``dispatcher run``: boot checks, then supervise until told to stop."""
    from dispatcher.runtime.logsetup import configure_logging

    configure_logging(config.logging, "supervisor")
    dsn = resolve_dsn(config.database)
    check_schema(config.source, dsn, config.database.connect_timeout, "dispatcher supervisor")
    # After the boot check, whose blocking connect still has libpq's connect_timeout.
    install_bounded_waits()
    return Supervisor(config, dsn).run()
