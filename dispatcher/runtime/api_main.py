"""Entry point of the API server process (``python -m dispatcher.runtime.api_main -c CONFIG``).

The patching below must stay the first code in this module: any module
imported before it would keep unpatched ``socket``/``threading`` objects.
``dispatcher/__init__``, ``dispatcher/api/__init__`` and ``dispatcher.runtime.entry``
import nothing that matters, so the imports before the patch are safe.
"""

from dispatcher.runtime.entry import patch_or_exit

patch_or_exit("dispatcher api")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import gevent  # noqa: E402

from dispatcher.api.app import create_app  # noqa: E402
from dispatcher.api.server import BoundedServer, ClientLimits, ensure_descriptors  # noqa: E402
from dispatcher.config import Config, load_config  # noqa: E402
from dispatcher.runtime.deadline import database_bound  # noqa: E402
from dispatcher.runtime.embedded import resolve_dsn  # noqa: E402
from dispatcher.runtime.entry import check_schema, run_command  # noqa: E402
from dispatcher.runtime.exitcodes import ExitCode  # noqa: E402
from dispatcher.runtime.logsetup import configure_logging  # noqa: E402

log = logging.getLogger("dispatcher.api")
# In-flight requests get this long to finish after SIGTERM/SIGINT.
SHUTDOWN_GRACE = 5.0


def serve(config: Config) -> int:
    dsn = resolve_dsn(config.database)
    # Fail fast at boot on an unreachable or unmigrated database, like every other command.
    check_schema(config.source, dsn, config.database.connect_timeout, "dispatcher-api")
    app = create_app(config, dsn, bound=database_bound)
    limits = ClientLimits.from_config(config.api)
    limits = dataclasses.replace(limits, max_connections=ensure_descriptors(limits.max_connections))
    # Past max_connections, new connections wait in the listen backlog; the
    # client timeouts (api/server.py) bound how long anyone holds a slot.
    server = BoundedServer(config.api.listen, app, limits,
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
    if app.reads is not None:
        log.info("history reads go to the standby named by api.read_dsn (the primary while it is down)")
    try:
        server.serve_forever()
    finally:
        app.close()
    log.info("API stopped")
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dispatcher-api", description="Serve the delivery-history API.")
    parser.add_argument("-c", "--config", required=True, help="YAML config file")
    args = parser.parse_args(argv)

    def command() -> int:
        config = load_config(args.config)
        configure_logging(config.logging, "api")
        try:
            return serve(config)
        except OSError as exc:  # e.g. the listen address is taken
            print(f"dispatcher: cannot serve on {config.api.listen[0]}:{config.api.listen[1]}: {exc}",
                  file=sys.stderr)
            return ExitCode.FAILURE

    return run_command(command, "dispatcher", args.config)


if __name__ == "__main__":
    sys.exit(main())
