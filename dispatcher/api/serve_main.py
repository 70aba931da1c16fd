"""Entry point of the API server process (``python -m dispatcher.api.serve_main -c CONFIG``).

The patching below must stay the first code in this module: any module
imported before it would keep unpatched ``socket``/``threading`` objects.
``dispatcher/__init__`` and ``dispatcher/api/__init__`` import nothing, so
the package imports that ``-m`` performs first are safe.
"""

from gevent import monkey

monkey.patch_all()

from psycogreen.gevent import patch_psycopg  # noqa: E402

patch_psycopg()

import argparse  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import gevent  # noqa: E402
from gevent.pywsgi import WSGIServer  # noqa: E402

from dispatcher import store  # noqa: E402
from dispatcher.api.app import create_app  # noqa: E402
from dispatcher.config import Config, ConfigError, load_config  # noqa: E402
from dispatcher.embedded import EmbeddedUnavailable, resolve_dsn  # noqa: E402
from dispatcher.exitcodes import ExitCode  # noqa: E402
from dispatcher.logsetup import configure_logging  # noqa: E402
from dispatcher.store import history  # noqa: E402

log = logging.getLogger("dispatcher.api")
# In-flight requests get this long to finish after SIGTERM/SIGINT.
SHUTDOWN_GRACE = 5.0
MAX_OPEN_REQUESTS = 1000


def _check_database(config: Config, dsn: str) -> None:
    """Fail fast at boot on an unreachable or unmigrated database, like every other command."""
    conn = store.connect(dsn, config.database.connect_timeout, "dispatcher-api")
    try:
        if not history.schema_ready(conn):
            raise store.SchemaOutdated("the API tables are missing; run 'dispatcher -c CONFIG migrate' first")
    finally:
        conn.close()


def serve(config: Config) -> int:
    dsn = resolve_dsn(config.database)
    _check_database(config, dsn)
    app = create_app(config, dsn)
    # Bound the greenlets too: past this many open requests, new connections
    # wait in the listen backlog instead of queueing for the database pool.
    server = WSGIServer(config.api.listen, app, spawn=MAX_OPEN_REQUESTS,
                        log=logging.getLogger("dispatcher.api.access"),
                        error_log=logging.getLogger("dispatcher.api.error"))

    def stop(signum: int) -> None:
        log.info("signal %d: stopping (grace %.0fs)", signum, SHUTDOWN_GRACE)
        server.stop(timeout=SHUTDOWN_GRACE)

    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, stop, signum)
    server.start()
    host, port = server.address[:2]
    # Tests (and operators with api.listen port 0) read the real port here.
    log.info("API listening on http://%s:%d", host, port)
    try:
        server.serve_forever()
    finally:
        app.pool.close()
    log.info("API stopped")
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dispatcher-api", description="Serve the delivery-history API.")
    parser.add_argument("-c", "--config", required=True, help="YAML config file")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"dispatcher: config error ({args.config}): {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    configure_logging(config.logging, "api")
    try:
        return serve(config)
    except (store.DatabaseUnavailable, EmbeddedUnavailable) as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return ExitCode.DATABASE_UNAVAILABLE
    except store.SchemaOutdated as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return ExitCode.SCHEMA_OUTDATED
    except store.StoreError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
    except OSError as exc:  # e.g. the listen address is taken
        print(f"dispatcher: cannot serve on {config.api.listen[0]}:{config.api.listen[1]}: {exc}", file=sys.stderr)
        return ExitCode.FAILURE


if __name__ == "__main__":
    sys.exit(main())
