"""Test support for the transport and SSRF tests (pytest side, never monkey-patched).

* :func:`run_green` / :func:`post_green`: run code in a gevent-patched child
  process (``green.py``) and get its JSON result back.
* :class:`LoopbackServer`: a scriptable TCP (optionally TLS) server on
  127.0.0.1 with one thread per connection; a handler gets a :class:`Peer`.
* :class:`TestCA` / :func:`self_signed`: throw-away certificates made with the
  ``cryptography`` package.

Everything listens on and connects to 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import datetime
import json
import socket
import ssl
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GREEN = Path(__file__).resolve().with_name("green.py")

KINDS = ("urllib3", "geventhttpclient")
#: Everything in these tests is on loopback, so loopback must be allowed explicitly.
LOOPBACK_POLICY: dict[str, Any] = {
    "require_https": False,
    "allow_private_networks": False,
    "allow_networks": ["127.0.0.0/8"],
}


# --------------------------------------------------------------------------- the green harness
def run_green(target: str, args: dict[str, Any], timeout: float = 30.0) -> Any:
    """Call ``target`` ("module:function") with ``args`` in a monkey-patched child process."""
    proc = subprocess.run(
        [sys.executable, str(GREEN), target, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"green harness exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@dataclass
class GreenRun:
    results: list[dict[str, Any]]
    dials: list[tuple[str, int]]
    dns_queries: list[str]
    max_rss_mb: float

    @property
    def only(self) -> dict[str, Any]:
        assert len(self.results) == 1, self.results
        return self.results[0]

    def body(self, index: int = 0) -> bytes:
        return base64.b64decode(self.results[index]["body_b64"])


def post(url: str, headers: dict[str, str] | None = None, body: bytes = b"") -> dict[str, Any]:
    return {"url": url, "headers": headers or {}, "body_b64": base64.b64encode(body).decode("ascii")}


def post_green(
    kind: str,
    posts: Sequence[str | dict[str, Any]],
    *,
    timeout: float = 5.0,
    policy: dict[str, Any] | None = None,
    dns: dict[str, list[list[str]]] | None = None,
    redirect: dict[str, tuple[str, int]] | None = None,
    concurrency: int = 1,
    harness_timeout: float = 30.0,
    **transport: Any,
) -> GreenRun:
    """Make ``posts`` (URLs or :func:`post` dicts) through a ``kind`` transport in a patched process."""
    args = {
        "kind": kind,
        "transport": {"timeout": timeout, "policy": policy or LOOPBACK_POLICY, **transport},
        "posts": [post(p) if isinstance(p, str) else p for p in posts],
        "dns": dns or {},
        "redirect": {ip: list(dest) for ip, dest in (redirect or {}).items()},
        "concurrency": concurrency,
    }
    out = run_green("tests.support.green:post_scenario", args, timeout=harness_timeout)
    return GreenRun(out["results"], [(ip, port) for ip, port in out["dials"]], out["dns_queries"], out["max_rss_mb"])


# --------------------------------------------------------------------------- loopback servers
@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes


class Peer:
    """One accepted connection, with helpers that give up when the server stops."""

    def __init__(self, sock: socket.socket, server: LoopbackServer) -> None:
        self.sock = sock
        self.server = server
        self._buffer = b""

    @property
    def stopped(self) -> bool:
        return self.server.stop.is_set()

    def recv(self) -> bytes:
        """Some bytes, or b"" once the client closed (or the server is stopping)."""
        while not self.stopped:
            try:
                return self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return b""
        return b""

    def read_request(self) -> Request | None:
        while b"\r\n\r\n" not in self._buffer:
            data = self.recv()
            if not data or len(self._buffer) > 1 << 20:
                return None
            self._buffer += data
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        request_line, *lines = head.decode("latin-1").split("\r\n")
        method, path, _version = request_line.split(" ", 2)
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self._buffer) < length:
            data = self.recv()
            if not data:
                return None
            self._buffer += data
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        request = Request(method, path, headers, body)
        self.server.requests.append(request)
        return request

    def send(self, data: bytes) -> bool:
        """Send everything; False once the client is gone or the server stops."""
        view = memoryview(data)
        while view:
            if self.stopped:
                return False
            try:
                sent = self.sock.send(view)
            except TimeoutError:
                continue  # the client is not reading right now
            except OSError:
                return False
            view = view[sent:]
            self.server.add_sent(sent)
        return True

    def trickle(self, data: bytes, interval: float) -> None:
        """Send one byte every ``interval`` seconds."""
        for i in range(len(data)):
            if not self.send(data[i : i + 1]) or self.server.stop.wait(interval):
                return

    def wait_closed(self) -> None:
        """Swallow whatever the client sends until it closes."""
        while self.recv():
            pass

    def reset(self) -> None:
        """Close with a TCP RST instead of a FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


Handler = Callable[[Peer], None]


class LoopbackServer:
    """``with LoopbackServer(handler) as server:`` -- serves 127.0.0.1:``server.port``."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None, bind: str = "127.0.0.1") -> None:
        self.handler = handler
        self.tls = tls
        self.bind = bind  # "127.0.0.1" or "::1": loopback only
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self.listener = socket.create_server((bind, 0), family=family)
        self.listener.settimeout(0.1)
        self.port: int = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.connections = 0
        self.requests: list[Request] = []
        self.bytes_sent = 0
        self.tls_failures = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def url(self, path: str = "/", host: str | None = None) -> str:
        scheme = "https" if self.tls else "http"
        host = host or (f"[{self.bind}]" if ":" in self.bind else self.bind)
        return f"{scheme}://{host}:{self.port}{path}"

    def add_sent(self, count: int) -> None:
        with self._lock:
            self.bytes_sent += count

    def __enter__(self) -> LoopbackServer:
        self._spawn(self._accept_loop)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in list(self._threads):
            thread.join(timeout=5)
        self.listener.close()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self.stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            with self._lock:
                self.connections += 1
            self._spawn(self._serve, sock)

    def _serve(self, sock: socket.socket) -> None:
        try:
            if self.tls is not None:
                sock.settimeout(5)
                try:
                    sock = self.tls.wrap_socket(sock, server_side=True)
                except (ssl.SSLError, OSError):
                    with self._lock:
                        self.tls_failures += 1
                    return
            sock.settimeout(0.1)  # short, so handlers notice self.stop
            self.handler(Peer(sock, self))
        finally:
            sock.close()


def response(status: int, body: bytes = b"", headers: dict[str, str] | None = None, reason: str = "X") -> bytes:
    """An HTTP/1.1 response with a Content-Length (unless ``headers`` frame it otherwise)."""
    fields = dict(headers or {})
    if "Transfer-Encoding" not in fields:
        fields.setdefault("Content-Length", str(len(body)))
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode("latin-1") + body


def responder(route: Callable[[Request], bytes] | bytes) -> Handler:
    """A keep-alive handler answering each request with ``route(request)`` (or fixed bytes)."""

    def handle(peer: Peer) -> None:
        while (request := peer.read_request()) is not None:
            if not peer.send(route(request) if callable(route) else route):
                return

    return handle


# --------------------------------------------------------------------------- certificates
@dataclass
class CertFiles:
    cert: Path
    key: Path


@dataclass
class TestCA:
    """A throw-away CA.  ``cert_path`` is what a client trusts (``ca_certs``)."""

    directory: Path
    _key: Any = field(init=False, repr=False)
    _cert: Any = field(init=False, repr=False)
    cert_path: Path = field(init=False)

    __test__ = False  # not a pytest test class

    def __post_init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self._key = ec.generate_private_key(ec.SECP256R1())
        self._cert = _build_cert(self._key, self._key, "dispatcher test CA", [], is_ca=True)
        self.cert_path = _write(self.directory / "ca.pem", _pem(self._cert))

    def issue(self, names: list[str], *, expired: bool = False, stem: str = "leaf") -> CertFiles:
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key(ec.SECP256R1())
        cert = _build_cert(key, self._key, names[0], names, issuer=self._cert, expired=expired)
        return CertFiles(_write(self.directory / f"{stem}.pem", _pem(cert)), _write_key(self.directory, stem, key))


def self_signed(directory: Path, names: list[str]) -> CertFiles:
    """A leaf certificate signed by its own key (no CA anyone trusts)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    cert = _build_cert(key, key, names[0], names)
    return CertFiles(_write(directory / "self-signed.pem", _pem(cert)), _write_key(directory, "self-signed", key))


def server_tls(files: CertFiles, sni_log: list[str | None] | None = None) -> ssl.SSLContext:
    """A server-side context presenting ``files``; records the SNI names clients send."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert, files.key)
    if sni_log is not None:

        def remember(_sock: Any, name: str | None, _ctx: Any) -> None:
            sni_log.append(name)

        context.sni_callback = remember
    return context


def _build_cert(
    key: Any,
    signing_key: Any,
    common_name: str,
    names: list[str],
    *,
    issuer: Any = None,
    is_ca: bool = False,
    expired: bool = False,
) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = (
        (now - datetime.timedelta(days=30), now - datetime.timedelta(days=1))
        if expired
        else (
            now - datetime.timedelta(hours=1),
            now + datetime.timedelta(days=1),
        )
    )
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if is_ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()), critical=False
        )
    return builder.sign(signing_key, hashes.SHA256())


def _pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _write_key(directory: Path, stem: str, key: Any) -> Path:
    from cryptography.hazmat.primitives import serialization

    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return _write(directory / f"{stem}.key", pem)
