"""The dispatcher as a subprocess, started exactly as in production."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Self

import psutil

REPO = Path(__file__).resolve().parents[2]


def process_tree(pid: int | None) -> list[psutil.Process]:
    """``pid`` and all its descendants ([] once it is gone)."""
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class Dispatcher:
    """``python -m dispatcher.cli -c CONFIG run`` (supervisor + forked workers) in its own
    process group; stdout and stderr (the log, unless the config names a file) go to
    ``output_path``.  ``repo`` is the checkout whose engine runs (another one can be
    measured under the same harness)."""

    def __init__(self, config_path: Path, output_path: Path, env: Mapping[str, str] | None = None, *,
                 repo: Path = REPO) -> None:
        self.config_path = config_path
        self.output_path = output_path
        self.repo = repo
        self._env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        # The caller's DISPATCHER_* settings must not leak into the run: the config file rules.
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
        env.update(self._env)
        env["PYTHONPATH"] = str(self.repo)
        with open(self.output_path, "ab") as out:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dispatcher.cli", "-c", str(self.config_path), "run"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=self.repo,
                start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def log(self) -> str:
        return self.output_path.read_text(errors="replace")

    def tree(self) -> list[psutil.Process]:
        return process_tree(self.pid)

    def worker_pids(self) -> list[int]:
        """The supervisor's children: its workers."""
        assert self.process is not None
        try:
            return [p.pid for p in psutil.Process(self.process.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        """TERM (a graceful shutdown), KILL the group if that hangs, then any stray worker."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        # Workers live in their own sessions: make sure none outlives the run.
        for proc in _orphans(self.process.pid):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _orphans(supervisor_pid: int) -> list[psutil.Process]:
    # A worker's command line names its supervisor (--owner host:PID:n).
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "dispatcher.runtime.worker_main" in cmdline and any(f":{supervisor_pid}:" in part for part in cmdline):
            found.append(proc)
    return found
