"""``dispatcher replay``: bulk replay by filter (issue 24, section 3), for operators.

It runs the API's own store functions (``store.replays``): the same filter
rule, the same workspace budget, the same audit entry (``token_id`` NULL: an
operator).  ``--dry-run`` prints the count and a sample; otherwise it prints
the job's id, then its progress until the region's upkeep leader has queued
every row (Ctrl-C stops watching, not the job).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import Any

from dispatcher import store
from dispatcher.config import Config
from dispatcher.rules.bulk_replay import (
    DEFAULT_STATUSES,
    DEFAULT_WINDOW,
    BulkReplayPolicy,
    ReplayFilter,
    filter_problem,
    percent,
)
from dispatcher.rules.replay_budget import ReplayBudget
from dispatcher.runtime.exitcodes import ExitCode, UsageError
from dispatcher.store import replays as replay_store

# How often the progress is read while a job runs.
POLL_SECONDS = 0.5


def _moment(text: str) -> datetime:
    """An ISO 8601 date-time with an offset (as the API takes it)."""
    try:
        parsed = datetime.fromisoformat(text.strip().upper().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date-time like 2026-09-01T02:00:00Z") from None
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no offset; write e.g. 2026-09-01T02:00:00Z")
    return parsed.astimezone(UTC)


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _ids(text: str) -> list[int]:
    ids = []
    for part in _names(text):
        if not part.isdigit() or not 0 < int(part) < 2**63:
            raise argparse.ArgumentTypeError(f"{part!r} is not an endpoint id")
        ids.append(int(part))
    return ids


def add_parser(commands: Any) -> None:
    replay = commands.add_parser("replay", help="re-queue a workspace's ended deliveries by filter (bulk replay)")
    replay.add_argument("--workspace", required=True)
    replay.add_argument("--since", type=_moment, default=None,
                        help="events created at or after this date-time (default: 24 h ago)")
    replay.add_argument("--until", type=_moment, default=None, help="events created before this date-time")
    replay.add_argument("--type", type=_names, action="extend", default=[], metavar="a,b",
                        help="event types (default: any)")
    replay.add_argument("--endpoint", type=_ids, action="extend", default=[], metavar="ID",
                        help="endpoint ids, comma-separated or repeated (default: every active endpoint)")
    replay.add_argument("--status", type=_names, action="extend", default=[], metavar="dead,failed",
                        help="statuses to re-queue: dead, failed, delivered (default: dead,failed)")
    replay.add_argument("--dry-run", action="store_true", help="print the count and a sample; queue nothing")
    replay.add_argument("--request-id", default=None,
                        help="idempotency key: running the command again with it finds the same job")
    replay.add_argument("--detach", action="store_true", help="print the job id and exit; do not watch it")


def _filter(config: Config, args: argparse.Namespace) -> ReplayFilter:
    now = datetime.now(UTC)
    rf = ReplayFilter(since=args.since or now - DEFAULT_WINDOW, until=args.until, types=tuple(args.type),
                      endpoints=tuple(args.endpoint), statuses=tuple(args.status) or DEFAULT_STATUSES,
                      since_defaulted=args.since is None)
    problem = filter_problem(rf, now, config.api.recover_max_age)
    if problem is not None:
        raise UsageError(f"replay refused: {problem}")
    return rf


def _progress(job: dict[str, Any]) -> str:
    done = job["state"] == "done"
    shown = percent(job["total"], job["queued"], done)
    return f"job {job['id']}: {'done, ' if done else ''}{job['queued']}/{job['total']} queued ({shown} %)"


def cmd_replay(config: Config, args: argparse.Namespace, conn: store.Connection) -> int:
    rf = _filter(config, args)
    store.workspace_contacts(conn, args.workspace)  # NotFound (exit 1) names a workspace that does not exist
    api = config.api
    budget = ReplayBudget(api.replays_per_hour, region_per_hour=api.region_replays_per_hour)
    if args.dry_run:
        found = replay_store.preview(conn, args.workspace, rf, budget, BulkReplayPolicy().sample)
        print(f"{found.total}+" if found.capped else found.total)
        for row in found.sample:
            print(f"delivery {row['id']}  event {row['event_id']} ({row['event_type']})  endpoint "
                  f"{row['endpoint_id']}  {row['status']}  {row['created_at'].isoformat()}")
        if found.capped:
            print(f"dry run: more than {found.total - 1} rows match, more than one hour's replay budget; "
                  "narrow the filter (--since/--until); nothing queued", file=sys.stderr)
        else:
            print(f"dry run: {found.total} rows would be queued, costing {found.units} replay units; nothing queued",
                  file=sys.stderr)
        return ExitCode.OK
    key = args.request_id or f"cli:{time.time_ns()}"
    job, created = replay_store.create_job(conn, args.workspace, rf, key, budget, None)
    print(job["id"], flush=True)
    if not created:
        print(f"job {job['id']} was made by an earlier run with this request id", file=sys.stderr)
    if args.detach:
        return ExitCode.OK
    last = ""
    while True:
        line = _progress(job)
        if line != last:
            print(line, flush=True)
            last = line
        if job["state"] == "done":
            return ExitCode.OK
        time.sleep(POLL_SECONDS)
        job = replay_store.get_job(conn, args.workspace, job["id"])
