"""Entry point of a worker process: monkey-patch first, then everything else.

gevent must patch ``socket``, ``ssl``, ``threading`` and friends before any
module imports them, and psycogreen must make psycopg2 cooperative before a
connection exists.  ``dispatcher/__init__.py`` and ``dispatcher.runtime.entry``
import nothing that matters, so running ``python -m dispatcher.runtime.worker_main``
reaches the patch first.
"""

from dispatcher.runtime.entry import patch_or_exit

patch_or_exit("dispatcher worker")  # a broken install is a boot failure (exit 4), not a crash to restart

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402

from dispatcher.config import WORKER_DSN_ENV, ConfigError, config_from_text, read_config_text  # noqa: E402
from dispatcher.runtime.exitcodes import ExitCode  # noqa: E402
from dispatcher.runtime.heap import settle_heap  # noqa: E402
from dispatcher.runtime.logsetup import configure_logging  # noqa: E402


def _raise_fd_limit() -> None:
    # Keep-alive pools to a thousand endpoints need more than the usual 1024
    # descriptors; the hard limit is the operator's ceiling, so take all of it.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> int:
    parser = argparse.ArgumentParser(prog="dispatcher-worker")
    parser.add_argument("--config", required=True)
    # The file the supervisor read (--config is its copy of it): what logs and errors name.
    parser.add_argument("--source")
    parser.add_argument("--owner", required=True)
    parser.add_argument("--heartbeat")
    args = parser.parse_args()
    _raise_fd_limit()
    try:
        config = config_from_text(read_config_text(args.config), source=args.source or args.config)
        configure_logging(config.logging, process_name=args.owner)
        from dispatcher.engine.worker import Worker

        dsn = os.environ.get(WORKER_DSN_ENV) or config.database.dsn
        worker = Worker(config, dsn, args.owner, args.heartbeat)
    except (ConfigError, ImportError, OSError, ValueError) as exc:
        print(f"dispatcher worker {args.owner}: boot failed: {exc}", file=sys.stderr)
        return ExitCode.WORKER_BOOT_FAILED
    except Exception as exc:  # anything else before "ready" is a boot failure too, never a crash loop
        print(f"dispatcher worker {args.owner}: boot failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return ExitCode.WORKER_BOOT_FAILED
    _settle_heap(args.owner)
    if args.heartbeat:
        _report_ready(args.heartbeat)
    gevent.signal_handler(signal.SIGTERM, worker.stop)
    gevent.signal_handler(signal.SIGQUIT, lambda: os._exit(ExitCode.OK))
    gevent.signal_handler(signal.SIGINT, lambda: os._exit(ExitCode.OK))
    worker.run()
    return ExitCode.OK


def _settle_heap(owner: str) -> None:
    # After boot, before the first claim: what boot made is frozen (dispatcher.runtime.heap).
    settled = settle_heap()
    logging.getLogger("dispatcher.worker").info(
        "worker %s heap settled: %d boot objects frozen, collector thresholds %s event=heap_settled",
        owner, settled.frozen, "/".join(map(str, settled.thresholds)))


def _report_ready(path: str) -> None:
    # The supervisor reads a non-empty heartbeat file as "booted": a worker
    # that dies before this line is a boot failure, after it a crash.
    with open(path, "w", encoding="ascii") as handle:
        handle.write("ready\n")


if __name__ == "__main__":
    sys.exit(main())
