"""Bulk replay by filter (issue 24, section 3): what a filter may ask for,
how fast a job queues its rows, and what its progress reads.

Pure values and decisions, like the other rules: the API and the CLI check a
filter with :func:`filter_problem` (one message for both), the worker's
replay loop paces a job by :class:`BulkReplayPolicy`, and the API, the CLI and
the console show :func:`percent`.  The budget a job spends is the single
replay's (``rules.replay_budget``): one unit per ``ROWS_PER_REPLAY_UNIT`` rows,
charged whole when the job is created.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

# The statuses a bulk replay may re-queue: ended rows.  ``pending`` rows are
# still being tried and ``shadow`` rows were never sent (rollout phase 0).
REPLAYABLE_STATUSES = ("dead", "failed", "delivered")
DEFAULT_STATUSES = ("dead", "failed")
# Without ``since`` a filter reaches this far back: the retry window, so
# "replay what died" means what died of the last outage, not of last month.
DEFAULT_WINDOW = timedelta(hours=24)
# Bounds on a filter's lists: a filter is a few names, not a data set.
MAX_TYPES = 20
MAX_ENDPOINTS = 100
MAX_TYPE_LENGTH = 200


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which rows a bulk replay re-queues: the newest row of each (event, endpoint)
    pair whose event was created in [since, until), of one of ``types`` (empty: any),
    to one of ``endpoints`` (empty: any active endpoint), ending in one of ``statuses``."""

    since: datetime
    until: datetime | None = None
    types: tuple[str, ...] = ()
    endpoints: tuple[int, ...] = ()
    statuses: tuple[str, ...] = DEFAULT_STATUSES
    # ``since`` was not given but defaulted (DEFAULT_WINDOW before the request): a retry
    # of the request, moments later, is still the same request.
    since_defaulted: bool = False

    def as_json(self) -> dict[str, object]:
        return {"since": self.since.isoformat(), "until": None if self.until is None else self.until.isoformat(),
                "types": list(self.types), "endpoints": list(self.endpoints), "statuses": list(self.statuses)}

    def fingerprint(self) -> str:
        """The same filter, however its lists were ordered, gives the same text: a retried
        request (same key) is recognised, and a key reused for another filter is refused."""
        canon = {**self.as_json(), "types": sorted(set(self.types)), "endpoints": sorted(set(self.endpoints)),
                 "statuses": sorted(set(self.statuses))}
        if self.since_defaulted:
            canon["since"] = "default"
        return hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()


def filter_problem(rf: ReplayFilter, now: datetime, max_age: float) -> str | None:
    """What is wrong with ``rf`` (a message naming the field), or None."""
    if rf.since < now - timedelta(seconds=max_age):
        return f"since may be at most {int(max_age // 86400)} days back"
    if rf.since > now:
        return "since is in the future: no event matches"
    if rf.until is not None and rf.until <= rf.since:
        return "until must be later than since"
    if not rf.statuses:
        return "statuses must name at least one status"
    unknown = sorted(set(rf.statuses) - set(REPLAYABLE_STATUSES))
    if unknown:
        return f"status {unknown[0][:40]!r} cannot be replayed; use {', '.join(REPLAYABLE_STATUSES)}"
    if len(rf.types) > MAX_TYPES:
        return f"at most {MAX_TYPES} event types"
    if any(not t or len(t) > MAX_TYPE_LENGTH for t in rf.types):
        return f"an event type must be 1 to {MAX_TYPE_LENGTH} characters"
    if len(rf.endpoints) > MAX_ENDPOINTS:
        return f"at most {MAX_ENDPOINTS} endpoints"
    if any(not 0 < e < 2**63 for e in rf.endpoints):
        return "an endpoint id must be a positive integer"
    return None


@dataclass(frozen=True, slots=True)
class BulkReplayPolicy:
    """How a job queues: ``batch_rows`` rows per transaction, then ``pause`` seconds
    before its next batch, so a job of 10,000 rows adds at most 500 rows/s to the
    outbox (well under what the claim drains) and never holds the workspace's
    replay lock for long.  ``sample`` rows are shown by a dry run."""

    batch_rows: int = 500
    pause: float = 1.0
    sample: int = 10

    def __post_init__(self) -> None:
        if self.batch_rows < 1 or self.pause < 0 or self.sample < 0:
            raise ValueError("batch_rows must be positive, pause and sample not negative")


def percent(total: int, queued: int, done: bool) -> int:
    """A job's progress: 100 once it has walked every candidate (some may have been skipped:
    replayed, delivered or deleted since it was counted), else the share queued, below 100."""
    if done:
        return 100
    if total <= 0:
        return 0
    return min(99, queued * 100 // total)
