"""The replay budget (RFC-014 security section): 100 replay units per
workspace per sliding hour.

A small immutable policy with pure decisions, like the retry and breaker
policies: it is given the workspace's spending in the window and answers
whether a request fits, and if not, when it would.  The store executes it
(``store.deliveries``: lock, read the window, spend, or raise ``ReplayLimited``) inside the transaction
that queues the rows, so a spend commits or rolls back with what it paid for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# A recover is charged one replay unit per this many rows it queues.
ROWS_PER_REPLAY_UNIT = 100
# Longest wait a refusal can name: the window is one hour.
WINDOW_SECONDS = 3600


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a replay does not fit, and in how many seconds it would (None: it never can)."""

    message: str
    retry_after: int | None


@dataclass(frozen=True, slots=True)
class Spent:
    """One entry of the window: units spent, and seconds until they leave it."""

    units: int
    expires_in: float


@dataclass(frozen=True, slots=True)
class ReplayBudget:
    per_hour: int
    rows_per_unit: int = ROWS_PER_REPLAY_UNIT
    # Every workspace of the region together: a loop of recovers spread over
    # many workspaces must not flood the shared outbox either.
    region_per_hour: int | None = None

    def units_for_rows(self, rows: int) -> int:
        return math.ceil(rows / self.rows_per_unit)

    def count_cap(self) -> int:
        """One row more than a workspace's hourly budget can ever pay for: counting a bulk
        replay's rows may stop there, since a request that large is refused whatever its size."""
        return self.per_hour * self.rows_per_unit + 1

    def refusal(self, window: Sequence[Spent], units: int) -> Refusal | None:
        """None if ``units`` fit beside the workspace's ``window`` (oldest first); else the
        refusal, with the seconds until enough of the oldest spending has left the window."""
        return _refusal(self.per_hour, window, units, "for this workspace")

    def region_refusal(self, window: Sequence[Spent], units: int) -> Refusal | None:
        """The same decision against the whole region's ``window`` and ``region_per_hour``."""
        if self.region_per_hour is None:
            return None
        return _refusal(self.region_per_hour, window, units, "for the region (all workspaces)")


def _refusal(limit: int, window: Sequence[Spent], units: int, scope: str) -> Refusal | None:
    used = sum(entry.units for entry in window)
    if used + units <= limit:
        return None
    if units > limit:
        return Refusal(f"this request needs {units} replay units but the hourly limit {scope} is {limit}", None)
    excess, freed = used + units - limit, 0
    retry_after = WINDOW_SECONDS  # unreachable fallback: the whole window frees `used` >= excess
    for entry in window:
        freed += entry.units
        if freed >= excess:
            retry_after = max(1, math.ceil(entry.expires_in))
            break
    return Refusal(f"replay limit of {limit} per hour reached {scope}", retry_after)
