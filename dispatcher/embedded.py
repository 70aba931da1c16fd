"""``database.dsn: embedded``: a real Postgres with no set-up, via pgserver.

pgserver (an optional extra, ``pip install .[embedded]``) ships Postgres
binaries in its wheel.  The server is started with its data under
``database.embedded_dir`` and left running (``cleanup_mode=None``) so that
the next command -- or the next run -- reuses it instead of paying the start
again.
"""

from __future__ import annotations

import os
from pathlib import Path

from dispatcher.config import EMBEDDED, DatabaseConfig


class EmbeddedUnavailable(RuntimeError):
    """pgserver is missing or could not start."""


def start_embedded(data_dir: str | os.PathLike[str]) -> str:
    """Start (or reuse) the embedded server and return its DSN."""
    try:
        import pgserver  # type: ignore[import-untyped]
    except ImportError:
        raise EmbeddedUnavailable(
            "database.dsn is 'embedded' but pgserver is not installed: pip install '.[embedded]'"
        ) from None
    path = Path(data_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(path, cleanup_mode=None)
    except Exception as exc:  # pgserver raises assorted errors; all mean "no server"
        raise EmbeddedUnavailable(f"embedded Postgres in {path} did not start: {exc}") from None
    return str(server.get_uri())


def resolve_dsn(database: DatabaseConfig) -> str:
    """The DSN to connect to, starting the embedded server when configured."""
    if database.dsn == EMBEDDED:
        return start_embedded(database.embedded_dir)
    return database.dsn
