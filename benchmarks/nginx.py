"""Debian's nginx as a receiver that answers every POST with 204 and logs it.

The scenario starts its own nginx (``daemon off``, one worker) from a config
written into a temporary directory: its own pid file, logs and temp paths, a
free 127.0.0.1 port, keep-alive with a very high ``keepalive_requests``.  Every
request leaves one access-log line carrying the ``Idempotency-Key`` and the
signature headers, so unique deliveries, duplicates and losses are counted
from the log.

nginx does not read the body (``return 204`` discards it), so it cannot check
signatures the way the Python mock receiver does: what is checked instead is
that every request carried ``webhook-id`` (equal to its ``Idempotency-Key``),
``webhook-timestamp`` and a ``v1,`` ``webhook-signature``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from dispatcher_devtools.kit import free_port

WORKER_PROCESSES = 1  # 2 cores are shared by Postgres, the senders, the harness and nginx
INSTALL_HINT = "apt-get install -y nginx"
SBIN_DIRS = os.pathsep.join(("/usr/sbin", "/usr/local/sbin"))  # not on every user's PATH

_CONFIG = """\
worker_processes {workers};
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
{user}
events {{
    worker_connections 8192;
}}

http {{
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    access_log off;
    # One line per request: time, status, method, path, connection (serial, requests on it), then
    # Idempotency-Key and the Standard Webhooks headers; the signature last (it may hold spaces).
    log_format deliveries '$msec $status $request_method $uri $connection $connection_requests '
                          '$http_idempotency_key $http_webhook_id $http_webhook_timestamp '
                          '$http_webhook_signature';
    keepalive_timeout 300s;
    keepalive_requests 10000000;
    server_tokens off;

    server {{
        listen 127.0.0.1:{port} backlog=4096;
        access_log {dir}/access.log deliveries buffer=256k flush=100ms;
        location / {{
            if ($request_method = POST) {{
                return 204;
            }}
            return 405;
        }}
    }}
}}
"""


class NginxMissing(RuntimeError):
    """nginx is not installed."""


def nginx_binary() -> str:
    """The nginx executable (on PATH, else in Debian's sbin), or NginxMissing with the install command."""
    found = shutil.which("nginx") or shutil.which("nginx", path=SBIN_DIRS)
    if found is None:
        raise NginxMissing(f"nginx is not installed (it is the receiver here): {INSTALL_HINT}")
    return found


def nginx_version() -> str:
    """``nginx/1.22.1`` (what ``nginx -v`` prints)."""
    done = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True, timeout=10, check=False)
    return (done.stderr or done.stdout).strip().rpartition(" ")[2]


@dataclass
class LogFigures:
    """What the access log says about the requests it holds."""

    requests: int = 0
    ok: int = 0                      # 2xx answers
    pairs: set[tuple[str, str]] = field(default_factory=set)  # (path, Idempotency-Key) of 2xx answers
    statuses: dict[str, int] = field(default_factory=dict)
    endpoints: dict[str, int] = field(default_factory=dict)  # 2xx answers per path (without the "/")
    signature_headers_missing: int = 0
    id_mismatch: int = 0             # webhook-id != Idempotency-Key
    connections: set[str] = field(default_factory=set)
    first_at: float | None = None
    last_at: float | None = None

    @property
    def duplicates(self) -> int:
        return self.ok - len(self.pairs)

    def add(self, line: str) -> None:
        parts = line.rstrip("\n").split(" ", 9)
        if len(parts) < 10:
            return
        at, status, _method, uri, connection, _nth, key, webhook_id, timestamp, signature = parts
        self.requests += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.connections.add(connection)
        moment = float(at)
        self.first_at = moment if self.first_at is None else min(self.first_at, moment)
        self.last_at = moment if self.last_at is None else max(self.last_at, moment)
        # nginx writes "-" for a header that was absent.
        if "-" in (webhook_id, timestamp) or not signature.startswith("v1,"):
            self.signature_headers_missing += 1
        if webhook_id != key:
            self.id_mismatch += 1
        if status.startswith("2"):
            self.ok += 1
            self.pairs.add((uri, key))
            path = uri.lstrip("/")
            self.endpoints[path] = self.endpoints.get(path, 0) + 1


class NginxReceiver:
    """nginx on 127.0.0.1 answering 204 to every POST, in its own process group.

    Offers what the throughput drain uses of the mock receiver (``url``, ``pid``,
    ``stats``) so the drain runs against either.
    """

    def __init__(self, directory: Path, *, workers: int = WORKER_PROCESSES, startup_timeout: float = 10.0) -> None:
        self.binary = nginx_binary()
        self.dir = directory / "nginx"
        self.workers = workers
        self.host = "127.0.0.1"
        self.port = 0
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._counted_bytes = self._counted_lines = 0

    # lifecycle -----------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        self.dir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        for _ in range(3):  # a free port can be taken between the probe and nginx's bind
            self.port = free_port()
            self._write_config()
            with open(self.dir / "stderr.log", "ab") as err:  # the child keeps its own descriptor
                self._process = subprocess.Popen(
                    [self.binary, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"), "-e",
                     str(self.dir / "error.log")],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            if self._wait_listening():
                return self
            last_error = self._tail()
            self._kill()
            if "Address already in use" not in last_error:
                break
        raise RuntimeError(f"nginx did not start: {last_error}")

    def _write_config(self) -> None:
        # Started as root, the master would hand the workers to "nobody"; they only use
        # descriptors the master opened, but keeping root avoids surprises with the temp dirs.
        user = "user root;" if os.geteuid() == 0 else ""
        (self.dir / "nginx.conf").write_text(
            _CONFIG.format(workers=self.workers, dir=self.dir, port=self.port, user=user), encoding="utf-8")
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "access.log").unlink()
        self._counted_bytes = self._counted_lines = 0

    def _wait_listening(self) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=0.5):
                return True
            time.sleep(0.02)
        return False

    def _tail(self) -> str:
        parts = []
        for name in ("stderr.log", "error.log"):
            path = self.dir / name
            if path.exists():
                parts.append(path.read_text(errors="replace")[-2000:])
        return "\n".join(parts).strip() or f"exit {self._process.poll() if self._process else None}"

    def stop(self) -> None:
        """QUIT (graceful: the buffered log lines are written), then KILL whatever is left."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGQUIT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process = process
            self._kill()

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    # addresses and figures -------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, profile: str, key: str) -> str:
        """``url("ok", "ep1")`` -> ``http://127.0.0.1:P/ep1``: nginx has one behaviour, 204."""
        if profile != "ok":
            raise ValueError(f"nginx only answers 204 (profile 'ok'), not {profile!r}")
        return f"{self.base_url}/{key}"

    @property
    def log_path(self) -> Path:
        return self.dir / "access.log"

    def logged(self) -> int:
        """Lines in the access log so far (what nginx has flushed); reads only what is new."""
        if not self.log_path.exists():
            return 0
        with open(self.log_path, "rb") as log:
            log.seek(self._counted_bytes)
            for chunk in iter(lambda: log.read(1 << 20), b""):
                self._counted_bytes += len(chunk)
                self._counted_lines += chunk.count(b"\n")
        return self._counted_lines

    def wait_logged(self, count: int, timeout: float) -> bool:
        """Until the log holds ``count`` lines (its buffer is flushed every 100 ms); False on timeout."""
        deadline = time.monotonic() + timeout
        while self.logged() < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def figures(self) -> LogFigures:
        found = LogFigures()
        if self.log_path.exists():
            with open(self.log_path, encoding="utf-8", errors="replace") as log:
                for line in log:
                    found.add(line)
        return found

    def stats(self, *, fast: bool = False) -> dict[str, Any]:
        """The mock receiver's /_stats shape where it applies (``bad_signatures`` is None: nginx does
        not read bodies) plus what only the log tells: missing signature headers, connections."""
        if fast:
            return {"requests": self.logged()}
        found = self.figures()
        return {
            "requests": found.requests, "total": found.ok, "duplicates": found.duplicates,
            "unique": len(found.pairs), "bad_signatures": None,
            "signature_headers_missing": found.signature_headers_missing, "id_mismatch": found.id_mismatch,
            "statuses": dict(sorted(found.statuses.items())), "connections": len(found.connections),
            "first_at": found.first_at, "last_at": found.last_at, "cpu_s": None,
            "endpoints": {path: {"ok": n} for path, n in found.endpoints.items()},
        }
