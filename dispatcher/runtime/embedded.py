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
by default), whose path is printed when this process starts the server (not
when it finds it running) or under ``-v``.  With ``-v`` it reaches stderr as
well.

``dispatcher embedded status|stop|reset`` (``dispatcher/cli/embedded.py``)
reports, stops and wipes the server through :func:`server_pid`,
:func:`stop_embedded` and :func:`reset_embedded`; :func:`connect` is the one
way a producer opens a connection from its config, embedded or not.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.config import EMBEDDED, Config, DatabaseConfig

if TYPE_CHECKING:
    from dispatcher.store import Connection

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
        was_running = server_pid(path) is not None
        try:
            server = pgserver.get_server(path, cleanup_mode=None)
        except Exception as exc:  # pgserver raises assorted errors; all mean "no server"
            raise EmbeddedUnavailable(f"embedded Postgres in {path} did not start: {exc} (log: {log_path})") from None
    # Said when it is news (this process started the server) or asked for (-v):
    # on every CLI call it was a 230-character line of noise.
    verbose = logging.getLogger().isEnabledFor(logging.INFO)
    if path not in _announced and (verbose or not was_running):
        _announced.add(path)
        print(f"dispatcher: embedded Postgres in {path}; its log: {log_path} (server log: {path / 'log'}; "
              "stop it with `dispatcher embedded stop`)", file=sys.stderr, flush=True)
    return str(server.get_uri())


def server_pid(data_dir: str | os.PathLike[str]) -> int | None:
    """The pid of the server running on ``data_dir``, or None (no server, or a stale postmaster.pid)."""
    try:
        pid = int((Path(data_dir) / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, run by pgserver's own user
    return pid


def stop_embedded(data_dir: str | os.PathLike[str], timeout: float = 60.0) -> bool:
    """Stop the server on ``data_dir`` (fast: sessions are ended); False when none ran."""
    path = Path(data_dir).resolve()
    if server_pid(path) is None:
        return False
    with _logged_to(path.parent / LOG_NAME):
        try:
            import pgserver
        except ImportError:
            raise EmbeddedUnavailable("pgserver is not installed: pip install '.[embedded]'") from None
        # Run as root, pgserver runs Postgres as its own user, whom pg_ctl must run as too.
        user = "pgserver" if os.geteuid() == 0 else None
        try:
            pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=str(path), user=user,  # type: ignore[attr-defined]
                            timeout=timeout)
        except subprocess.CalledProcessError:
            if server_pid(path) is not None:
                raise EmbeddedUnavailable(f"embedded Postgres in {path} did not stop (log: {path / 'log'})") from None
    return True


def reset_embedded(data_dir: str | os.PathLike[str]) -> bool:
    """Stop the server and delete its data directory; the next start begins empty.  False: nothing was there."""
    path = Path(data_dir).resolve()
    stop_embedded(path)
    if not path.exists():
        return False
    shutil.rmtree(path)
    return True


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


def connect(config: Config, application_name: str = "dispatcher-producer") -> Connection:
    """A connection to ``config``'s database, starting the embedded server when
    ``database.dsn`` is ``embedded``: the one documented way for a producer
    (README, "Producer API").  A plain psycopg2 connection, not autocommitting:
    ``WebhookSender.send`` runs in the caller's transaction, and the caller commits."""
    from dispatcher import store  # here: the supervisor and the CLI import this module before they need a store

    return store.connect(resolve_dsn(config.database), config.database.connect_timeout, application_name)
