"""``python -m dispatcher_devtools.receiver``: the command line."""

from __future__ import annotations

import argparse
import contextlib
import resource
import ssl
from collections.abc import Sequence
from typing import Final

from dispatcher.signing import secret_key
from dispatcher_devtools.receiver.processes import run_single, run_supervisor
from dispatcher_devtools.receiver.profiles import load_profile_file

DEFAULT_MAX_ENDPOINTS: Final = 65_536


def _listen_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _package_doc() -> tuple[str, str]:
    """The package docstring's first line, and the rest: the notes the help prints after the options."""
    import dispatcher_devtools.receiver as package

    first, _, rest = (package.__doc__ or "Mock webhook receiver.").strip().partition("\n")
    return first, rest.strip()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    # Usage and options first, then the package notes (about 70 lines): a reader
    # of --help wants the options, which used to come after all of them.
    summary, notes = _package_doc()
    parser = argparse.ArgumentParser(
        prog="python -m dispatcher_devtools.receiver", description=summary, epilog=notes,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--listen", type=_listen_address, default=("127.0.0.1", 0), help="HOST:PORT (port 0: pick one)")
    parser.add_argument("--secret", action="append", default=[], help="signing secret, plain or whsec_ (repeatable)")
    parser.add_argument("--profiles", help="YAML file: endpoint-key -> profile fields")
    parser.add_argument("--processes", type=int, default=1, help="serving processes sharing the port")
    parser.add_argument("--ready-file", help="write {host, port, pid} JSON here once accepting")
    parser.add_argument("--seed", type=int, help="seed for the random latencies and errors")
    parser.add_argument("--max-endpoints", type=int, default=DEFAULT_MAX_ENDPOINTS)
    parser.add_argument("--watch-stdin", action="store_true", help="exit when stdin reaches EOF")
    parser.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (chain), PEM")
    parser.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert, PEM")
    parser.add_argument("--export-ids", metavar="FILE",
                        help="write the received webhook ids here, one per line, at shutdown and on POST /_export_ids")
    options = parser.parse_args(argv)
    if options.processes < 1:
        parser.error("--processes must be at least 1")
    if bool(options.tls_cert) != bool(options.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    return options


def _raise_file_limit() -> None:
    # Benchmarks may hold thousands of keep-alive connections; the soft default
    # (often 1024) would make accept() fail long before the CPU runs out.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))


def main(argv: Sequence[str] | None = None) -> int:
    options = _parse_args(argv)
    _raise_file_limit()
    keys = tuple(dict.fromkeys(secret_key(secret) for secret in options.secret))
    profiles = load_profile_file(options.profiles) if options.profiles else {}
    tls = _tls_context(options.tls_cert, options.tls_key)
    if options.processes == 1:
        return run_single(options, keys, profiles, tls)
    return run_supervisor(options, keys, profiles, tls)


def _tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The server context, loaded once before any fork (a bad file fails the start, not a child)."""
    if not cert or not key:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context

