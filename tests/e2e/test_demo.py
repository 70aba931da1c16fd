"""The local demo (``bin/dispatcher-demo``) with real processes: however it is stopped, it stops what it started.

Killed with TERM, or hung up on (its terminal gone: HUP to its whole process
group), the demo used to leave its supervisor and workers running -- and the
hangup reached the supervisor too, which reloaded its workers instead of
stopping.  Each test runs the demo until its workers deliver, stops it, and
checks that every process it started is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatcher.config import DSN_ENV
from dispatcher_devtools.kit import REPO, wait_until
from tests.conftest import TestDatabase as Database


def _children() -> dict[int, int]:
    """Every process's parent: pid -> ppid, from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    return parents


def descendants(pid: int) -> set[int]:
    parents = _children()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Runs (a zombie, exited but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _at_least(count: int, pids: set[int]) -> set[int] | None:
    return pids if len(pids) >= count else None


def delivered(db: Database) -> bool:
    return bool(db.query("SELECT 1 FROM webhook_deliveries WHERE status = 'delivered' LIMIT 1"))


STOPS = {"TERM to the demo": (signal.SIGTERM, False, 128 + signal.SIGTERM),
         "HUP to its process group (terminal lost)": (signal.SIGHUP, True, 128 + signal.SIGHUP),
         "INT to its process group (Ctrl-C)": (signal.SIGINT, True, 130)}


# The demo stops its dispatcher within graceful_timeout + 30 s (45 s) and its receiver within 5 s.
STOP_WITHIN = 60.0


def _exit_output(demo: subprocess.Popen[bytes], tmp_path: Path, how: str) -> bytes:
    """The demo's output once it exits; one that does not within ``STOP_WITHIN`` is asked where it is
    (USR1: its threads' stacks), killed, and fails the test with that and its dispatcher's last lines."""
    try:
        output, _ = demo.communicate(timeout=STOP_WITHIN)
        return output
    except subprocess.TimeoutExpired:
        demo.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        demo.kill()
        output, _ = demo.communicate()
    log = tmp_path / "demo-dispatcher.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else ["(no log)"]
    tail = "\n".join([line for line in lines if " dispatcher.attempt " not in line][-40:])
    pytest.fail(f"the demo did not exit within {STOP_WITHIN:.0f} s of {how}; its output, with its stacks:\n"
                f"{output.decode(errors='replace')}\nits dispatcher's log but attempt lines, last lines:\n{tail}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", sorted(STOPS))
def test_the_demo_stops_everything_it_started(db: Database, write_config, tmp_path: Path,  # type: ignore[no-untyped-def]
                                              how: str) -> None:
    config = write_config(db, workers={"processes": 2}, database={"embedded_dir": str(tmp_path / "pgdata")})
    env = {k: v for k, v in os.environ.items() if k != DSN_ENV}
    env["PYTHONPATH"] = str(REPO)
    # Its own session, as a shell gives a foreground job; far more events than it will produce before the stop.
    demo = subprocess.Popen([sys.executable, str(REPO / "bin" / "dispatcher-demo"), "-c", str(config),
                             "--events", "100000", "--rate", "20"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    started: set[int] = set()
    try:
        wait_until(lambda: delivered(db), timeout=120, message="the demo's first delivery")
        # receiver, supervisor and its two workers at least (each may have helpers of its own)
        started = wait_until(lambda: _at_least(4, descendants(demo.pid)), timeout=60,
                                       message="the demo's processes")
        signum, to_group, code = STOPS[how]
        if to_group:
            os.killpg(demo.pid, signum)
        else:
            demo.send_signal(signum)
        output = _exit_output(demo, tmp_path, how)
        left = wait_until(lambda: not {pid for pid in started if alive(pid)} or None, timeout=60,
                          message=f"every process the demo started to stop; still running: "
                                  f"{sorted(pid for pid in started if alive(pid))}")
        assert left
        text = output.decode(errors="replace")
        assert demo.returncode == code, text
        assert "Traceback" not in text, text
        # Its dispatcher stopped on TERM: the demo did not have to kill it after graceful_timeout + 30 s.
        assert "did not stop within" not in text, text
        # The secrets it made are shown, once, and it says so.
        (shown,) = [line for line in text.splitlines() if "shown this once" in line]
        stored = [secret for (secret,) in db.query("SELECT secret FROM webhook_endpoints")]
        assert len(stored) == 5 and all(secret in shown for secret in stored), shown
    finally:
        # Whatever failed, leave nothing running: the demo and everything it started.
        for pid in (started | descendants(demo.pid)) - {os.getpid()}:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if demo.poll() is None:
            demo.kill()
        demo.wait()
