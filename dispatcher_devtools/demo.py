"""``bin/dispatcher-demo -c config/local.yaml``: the whole system on one machine.

Starts (or reuses) the configured database -- the embedded Postgres by
default -- migrates it, starts the local mock receiver with five endpoints
(three healthy, one flaky, one down), runs the real supervisor and its
workers, produces events through ``WebhookSender`` at a steady rate and prints
progress every second until every deliverable row is delivered.  Rows for the
"down" endpoint stay pending, retrying on the 24 h schedule: nothing is lost.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dispatcher import store
from dispatcher.config import DSN_ENV, Config, load_config
from dispatcher.producer import Event, WebhookSender
from dispatcher.runtime.embedded import resolve_dsn
from dispatcher.runtime.entry import run_command
from dispatcher.runtime.exitcodes import ExitCode, UsageError
from dispatcher.signing import new_secret
from dispatcher_devtools.receiver import ReceiverProcess, closed_port_url

WORKSPACE = "demo"
SECRET = "whsec_ZGVtby1zZWNyZXQtZm9yLWxvY2FsLW9ubHktMDEyMzQ1"


class DemoError(UsageError):
    """The demo cannot run with this configuration."""


@dataclass
class Progress:
    produced: int = 0
    started: float = 0.0
    delivered: int = 0
    reported: float = 0.0


def _check_config(config: Config) -> None:
    if config.http.require_https or not config.http.allow_private_networks:
        raise DemoError("the demo sends to a receiver on 127.0.0.1: use config/local.yaml "
                        "(http.require_https: false, http.allow_private_networks: true)")


ENDPOINTS = ("healthy-1", "healthy-2", "healthy-3", "flaky", "down")


def endpoint_secrets() -> dict[str, str]:
    """Each demo endpoint's own signing secret, made before the receiver starts so it can verify them all."""
    return {name: new_secret() for name in ENDPOINTS}


def seed(conn: store.Connection, receiver: ReceiverProcess, secrets: dict[str, str]) -> dict[str, int]:
    """A fresh demo workspace with five endpoints, each signing with its secret of ``secrets``;
    returns name -> endpoint id."""
    store.delete_workspace_endpoints(conn, WORKSPACE)
    store.create_workspace(conn, WORKSPACE, SECRET, {"webhook_outbox": True})
    urls = {
        "healthy-1": receiver.url("latency", "healthy-1", median_ms=30, sigma=0.5),
        "healthy-2": receiver.url("latency", "healthy-2", median_ms=30, sigma=0.5),
        "healthy-3": receiver.url("ok", "healthy-3"),
        "flaky": receiver.url("error", "flaky", rate=0.1, status=503),
        "down": closed_port_url(),
    }
    return {name: store.add_endpoint(conn, WORKSPACE, url, [], secrets[name]) for name, url in urls.items()}


def _counts(conn: store.Connection, endpoint_ids: list[int]) -> dict[str, int]:
    return store.delivery_status_counts(conn, endpoint_ids)


class Stopped(BaseException):
    """The demo was told to stop (TERM, or HUP: its terminal is gone); a BaseException so that
    no ``except Exception`` on the way swallows it and every ``finally`` stops what was started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_on_signals() -> None:
    """TERM and HUP stop the demo as Ctrl-C does: killed without this, it left its dispatcher running."""
    def stop(signum: int, frame: object) -> None:
        # Once: the clean-up that follows must not be cut short by a second signal.
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise Stopped(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _start_dispatcher(config: Config, dsn: str, log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, **{DSN_ENV: dsn})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Its own session: the terminal's signals (a hangup, Ctrl-C) reach the demo
    # alone, which stops the supervisor with TERM; a HUP reaching the supervisor
    # directly made it reload its workers instead of stopping.
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "dispatcher.cli", "-c", config.source, "run"], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop_dispatcher(dispatcher: subprocess.Popen[bytes], grace: float) -> None:
    """TERM (graceful: in-flight sends finish, unsent rows go back), then KILL to the whole group."""
    if dispatcher.poll() is not None:
        return
    dispatcher.send_signal(signal.SIGTERM)
    try:
        dispatcher.wait(grace)
    except subprocess.TimeoutExpired:
        print(f"[demo] the dispatcher did not stop within {grace:.0f}s; killing it and its workers", file=sys.stderr)
        os.killpg(dispatcher.pid, signal.SIGKILL)  # its own session: the group is the supervisor's
        dispatcher.wait()


def _produce(sender: WebhookSender, conn: store.Connection, count: int) -> None:
    with sender.transaction(conn) as tx:
        for n in range(count):
            tx.send(Event(WORKSPACE, "job.completed", {"job_id": f"job-{n}", "technician": "t-7"}))


def _report(progress: Progress, counts: dict[str, int], receiver: ReceiverProcess) -> str:
    now = time.monotonic()
    delivered = counts.get("delivered", 0)
    rate = (delivered - progress.delivered) / max(now - progress.reported, 0.001)
    progress.delivered, progress.reported = delivered, now
    return (f"[demo {now - progress.started:5.1f}s] produced {progress.produced:6d} events | delivered "
            f"{delivered:6d} ({rate:5.0f}/s) | pending {counts.get('pending', 0):6d} | dead {counts.get('dead', 0)} "
            f"| receiver got {receiver.stats(fast=True).get('total', 0)}")


def run_demo(config: Config, events: int, rate: float) -> int:
    _check_config(config)
    dsn = resolve_dsn(config.database)
    conn = store.connect(dsn, config.database.connect_timeout, "dispatcher demo")
    applied = store.migrate(conn)
    print(f"[demo] database ready ({'migrated ' + str(applied) if applied else 'schema up to date'})", flush=True)
    secrets = endpoint_secrets()
    with ReceiverProcess(secrets=list(secrets.values())) as receiver:
        ids = seed(conn, receiver, secrets)
        print(f"[demo] receiver on {receiver.base_url}; endpoints {ids}", flush=True)
        # Every path that makes a secret shows it once (docs/decisions.md, "Own secret per endpoint").
        print("[demo] each endpoint signs with its own secret, shown this once (the receiver verifies with them): "
              + ", ".join(f"{name} {secrets[name]}" for name in ENDPOINTS), flush=True)
        log_path = Path(config.database.embedded_dir).parent / "demo-dispatcher.log"
        dispatcher = _start_dispatcher(config, dsn, log_path)
        print(f"[demo] dispatcher started: one worker per core; its log (one line per attempt) is {log_path}",
              flush=True)
        try:
            return _drive(config, conn, dispatcher, receiver, ids, events, rate)
        finally:
            _stop_dispatcher(dispatcher, config.workers.graceful_timeout + 30.0)


def _drive(config: Config, conn: store.Connection, dispatcher: subprocess.Popen[bytes],
           receiver: ReceiverProcess, ids: dict[str, int], events: int, rate: float) -> int:
    sender = WebhookSender(config)
    progress = Progress(started=time.monotonic(), reported=time.monotonic())
    deliverable = [ids[name] for name in ("healthy-1", "healthy-2", "healthy-3", "flaky")]
    last_report = 0.0
    while True:
        if dispatcher.poll() is not None:
            print(f"[demo] the dispatcher exited with code {dispatcher.returncode}", file=sys.stderr)
            return ExitCode.FAILURE
        due = min(events, int((time.monotonic() - progress.started) * rate) + 1)
        if due > progress.produced:
            _produce(sender, conn, due - progress.produced)
            progress.produced = due
        if time.monotonic() - last_report >= 1.0:
            last_report = time.monotonic()
            counts = _counts(conn, list(ids.values()))
            print(_report(progress, counts, receiver), flush=True)
            done = _counts(conn, deliverable).get("delivered", 0) == events * len(deliverable)
            if progress.produced == events and done:
                return _summary(conn, ids, receiver, events)
        time.sleep(0.05)


def _summary(conn: store.Connection, ids: dict[str, int], receiver: ReceiverProcess, events: int) -> int:
    stats = receiver.stats()
    down = _counts(conn, [ids["down"]])
    print(f"[demo] done: {events} events x 4 reachable endpoints delivered; receiver verified every signature "
          f"(bad signatures: {sum(e.get('bad_signatures', 0) for e in stats['endpoints'].values())}).")
    print(f"[demo] the 'down' endpoint holds {down.get('pending', 0)} pending rows: they retry for 24 h "
          f"(then 'dead', replayable) -- nothing is lost. Stopping the dispatcher.", flush=True)
    return ExitCode.OK


def _events(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of events")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    # 0 or less never produces the last event, and the demo would wait for it forever.
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of events per second")
    return value


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dispatcher-demo", description=__doc__.splitlines()[0].strip("`"))
    parser.add_argument("-c", "--config", required=True, help="the dispatcher's YAML config (config/local.yaml)")
    parser.add_argument("--events", type=_events, default=2000, help="events to produce (default: %(default)s)")
    parser.add_argument("--rate", type=_rate, default=200.0, help="events per second (default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)

    def demo() -> int:
        config = load_config(args.config)
        # The producer's statements run on the demo's own connection, untranslated.
        with store.translated():
            return run_demo(config, args.events, args.rate)

    _stop_on_signals()
    # USR1 prints where every thread is, to stderr: how a demo that does not stop is asked why
    # (tests/e2e/test_demo.py does so before it kills one).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        return run_command(demo, "dispatcher-demo", args.config)
    except Stopped as stopped:
        with contextlib.suppress(OSError):  # after a hangup there may be no terminal left to tell
            print(f"[demo] {stopped}: stopped the dispatcher and the receiver", file=sys.stderr, flush=True)
        return 128 + stopped.signum


if __name__ == "__main__":
    sys.exit(main())
