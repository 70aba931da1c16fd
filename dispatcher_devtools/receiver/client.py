"""The library side: :class:`ReceiverProcess` runs the receiver as a
subprocess and reads its counters; :func:`signed_headers` and
:func:`closed_port_url` help tests build deliveries and dead endpoints."""

from __future__ import annotations

import contextlib
import csv
import http.client
import io
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote, urlencode

from dispatcher.signing import secret_key, signature_header
from dispatcher_devtools.receiver.profiles import BASE_PROFILES


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook-id as one endpoint saw it (a /_deliveries row)."""

    webhook_id: str
    endpoint: str
    first_2xx_ts: float | None   # time.time() when the first 2xx answer was sent
    count: int                   # requests with a valid signature carrying this id
    ok: int                      # of those, answered 2xx
    attempts: tuple[str, ...]    # every X-Larkspur-Attempt seen ("-" when absent)
    idempotency_keys: tuple[str, ...]  # the distinct Idempotency-Key values seen


def signed_headers(
    secrets: str | Sequence[str], webhook_id: str, body: bytes, *,
    attempt: int | None = 1, idempotency_key: str | None = None, timestamp: int | None = None,
) -> dict[str, str]:
    """Headers of a correctly signed delivery (the Idempotency-Key defaults to the id)."""
    secret_list = [secrets] if isinstance(secrets, str) else list(secrets)
    stamp = int(time.time()) if timestamp is None else timestamp
    headers = {
        "Content-Type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": signature_header(
            [secret_key(s) for s in secret_list], webhook_id, stamp, body
        ),
        "Idempotency-Key": webhook_id if idempotency_key is None else idempotency_key,
    }
    if attempt is not None:
        headers["X-Larkspur-Attempt"] = str(attempt)
    return headers


# Bound, never listening: a connect gets RST (ECONNREFUSED) and, while held, no
# other socket on the host can take the port.
_CLOSED_PORTS: list[socket.socket] = []


def closed_port_url(key: str = "down") -> str:
    """A URL on 127.0.0.1 whose port refuses connections for this process's lifetime."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    _CLOSED_PORTS.append(sock)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/down/{quote(key, safe='')}"


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Finaliser: leave no receiver processes behind, whatever happened to the caller."""
    if process.poll() is None:
        # The leader is not reaped yet, so its pid (= the group id) cannot be reused.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class ReceiverProcess:
    """``python -m dispatcher_devtools.receiver`` on 127.0.0.1 with an ephemeral port
    (or ``port``, e.g. to bring back an endpoint that was down).

    Use as a context manager; it stops the receiver (and its children) on exit,
    and a finaliser kills it if the object is dropped or the interpreter exits.
    """

    def __init__(
        self, secrets: Sequence[str] = (), *, profiles: Mapping[str, Any] | str | Path | None = None,
        processes: int = 1, seed: int | None = None, max_endpoints: int | None = None,
        startup_timeout: float = 20.0, control_timeout: float = 120.0, port: int = 0,
        export_ids: str | Path | None = None, tls_cert: str | Path | None = None, tls_key: str | Path | None = None,
    ) -> None:
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        self._tls = None if tls_cert is None or tls_key is None else (Path(tls_cert).absolute(),
                                                                       Path(tls_key).absolute())
        self.secrets = [secrets] if isinstance(secrets, str) else list(secrets)
        # Absolute: the receiver's working directory need not be ours.
        self.export_path = None if export_ids is None else Path(export_ids).absolute()
        self._profiles = profiles
        self._processes = processes
        self._seed = seed
        self._max_endpoints = max_endpoints
        self._startup_timeout = startup_timeout
        self._control_timeout = control_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], ReceiverProcess] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self.host = "127.0.0.1"
        self.port = port

    # lifecycle -----------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        if self._process is not None:
            raise RuntimeError("already started")
        self._workdir = tempfile.TemporaryDirectory(prefix="receiver-")
        workdir = Path(self._workdir.name)
        ready = workdir / "ready.json"
        log = open(workdir / "receiver.log", "wb")  # noqa: SIM115 -- handed to the child
        try:
            self._process = subprocess.Popen(
                self._command(workdir, ready), stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env=self._environment(),
            )
        finally:
            log.close()
        self._finalizer = weakref.finalize(self, _kill_group, self._process)
        try:
            self._wait_ready(ready, workdir / "receiver.log")
        except BaseException:
            self.stop()
            raise
        return self

    def _command(self, workdir: Path, ready: Path) -> list[str]:
        command = [
            sys.executable, "-m", "dispatcher_devtools.receiver", "--listen", f"{self.host}:{self.port}",
            "--ready-file", str(ready), "--processes", str(self._processes), "--watch-stdin",
        ]
        for secret in self.secrets:
            command += ["--secret", secret]
        if self._seed is not None:
            command += ["--seed", str(self._seed)]
        if self._max_endpoints is not None:
            command += ["--max-endpoints", str(self._max_endpoints)]
        if self.export_path is not None:
            command += ["--export-ids", str(self.export_path)]
        if self._tls is not None:
            command += ["--tls-cert", str(self._tls[0]), "--tls-key", str(self._tls[1])]
        if isinstance(self._profiles, Mapping):
            path = workdir / "profiles.yaml"
            path.write_text(json.dumps(self._profiles), encoding="utf-8")  # JSON is YAML
            command += ["--profiles", str(path)]
        elif self._profiles is not None:
            command += ["--profiles", str(self._profiles)]
        return command

    @staticmethod
    def _environment() -> dict[str, str]:
        # The child must import this very checkout (dispatcher_devtools is never
        # installed, e.g. under tox), wherever the caller runs from.
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def _wait_ready(self, ready: Path, log: Path) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._startup_timeout
        while not ready.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(encoding="utf-8", errors="replace")[-4000:]
                raise RuntimeError(f"receiver did not start (exit {self._process.poll()}):\n{tail}")
            time.sleep(0.01)
        self.port = int(json.loads(ready.read_text(encoding="utf-8"))["port"])

    def stop(self) -> None:
        """SIGTERM the receiver's process group, then SIGKILL whatever is left."""
        if self.export_path is not None and self.running:
            # The group-wide SIGTERM below reaches --processes N children before their
            # supervisor could ask them for their ids, so export while all are alive.
            with contextlib.suppress(OSError, RuntimeError):
                self.export_ids()
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=5)
                except ProcessLookupError:
                    pass
                except subprocess.TimeoutExpired:
                    _kill_group(process)
            process.wait()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    # addresses and control -------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self.host}:{self.port}"

    def url(self, profile: str, key: str, **params: Any) -> str:
        """``url("error", "ep1", rate=0.5)`` -> ``http://127.0.0.1:P/error/ep1?rate=0.5``."""
        if profile not in BASE_PROFILES:
            raise ValueError(f"unknown profile {profile!r}")
        query = urlencode({k: _query_value(v) for k, v in params.items()})
        return f"{self.base_url}/{profile}/{quote(key, safe='')}" + (f"?{query}" if query else "")

    def _connection(self) -> http.client.HTTPConnection:
        if self._tls is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=self._control_timeout)
        # Control requests go to our own child on loopback, whose certificate may come
        # from any CA (the test's): there is nothing to verify it against, nor a need to.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(self.host, self.port, timeout=self._control_timeout, context=context)

    def _request(self, method: str, path: str, body: bytes | None = None) -> http.client.HTTPResponse:
        connection = self._connection()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        if response.status != 200:
            detail = response.read().decode("utf-8", "replace")
            connection.close()
            raise RuntimeError(f"{method} {path}: {response.status} {detail}")
        return response

    def _json(self, method: str, path: str, body: bytes | None = None) -> Any:
        response = self._request(method, path, body)
        try:
            return json.loads(response.read())
        finally:
            response.close()

    def healthy(self) -> bool:
        try:
            self._request("GET", "/_healthz").close()
        except OSError:
            return False
        return True

    def stats(self, *, fast: bool = False) -> dict[str, Any]:
        """The /_stats document; ``fast`` skips the cross-process id merge (unique: null)."""
        return dict(self._json("GET", "/_stats?fast=1" if fast else "/_stats"))

    def endpoint(self, key: str, *, fast: bool = False) -> dict[str, Any]:
        """One endpoint's counters ({} if it has seen nothing)."""
        return dict(self.stats(fast=fast)["endpoints"].get(key, {}))

    def deliveries(self) -> list[Delivery]:
        return list(self.iter_deliveries())

    def iter_deliveries(self) -> Iterator[Delivery]:
        """Stream /_deliveries without holding 10^6 rows twice."""
        response = self._request("GET", "/_deliveries")
        try:
            reader = csv.reader(io.TextIOWrapper(response, encoding="utf-8", newline=""))
            next(reader, None)  # header
            for wid, key, first, count, ok, attempts, idem in reader:
                yield Delivery(
                    wid, key, float(first) if first else None, int(count), int(ok),
                    tuple(attempts.split()), tuple(idem.split()),
                )
        finally:
            response.close()

    def set_profile(self, key: str, profile: Mapping[str, Any] | str | None) -> None:
        """Override ``key``'s profile in every process (None restores the URL's/file's)."""
        if profile is None:
            self._json("DELETE", f"/_profile/{quote(key, safe='')}")
            return
        spec = {"profile": profile} if isinstance(profile, str) else dict(profile)
        self._json("POST", f"/_profile/{quote(key, safe='')}", json.dumps(spec).encode())

    def export_ids(self) -> int:
        """Write every id received so far to the ``export_ids`` file now; returns how many."""
        if self.export_path is None:
            raise RuntimeError("this receiver was started without export_ids")
        return int(self._json("POST", "/_export_ids")["ids"])

    def reset(self, *, profiles: bool = False) -> None:
        """Forget all counters (and the runtime profile overrides when ``profiles``)."""
        self._json("POST", "/_reset?profiles=1" if profiles else "/_reset")

    def wait_until(
        self, predicate: Callable[[dict[str, Any]], bool], *, timeout: float = 10.0,
        interval: float = 0.02, fast: bool = False,
    ) -> dict[str, Any]:
        """Poll /_stats until ``predicate(stats)`` holds; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats(fast=fast)
            if predicate(stats):
                return stats
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout}s; last stats: {stats}")
            time.sleep(interval)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


