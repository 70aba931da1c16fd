"""The replay budget (RFC-014 security section): 100 replay units per
workspace per sliding hour.

A small immutable policy with pure decisions, like the retry and breaker
policies: it is given the workspace's spending in the window and answers
whether a request fits, and if not, when it would.  The store executes it
(``store.api_data``: lock, read the window, spend) inside the transaction
that queues the rows, so a spend commits or rolls back with what it paid for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dispatcher.store import LimitReached

# A recover is charged one replay unit per this many rows it queues.
ROWS_PER_REPLAY_UNIT = 100
# Longest wait a refusal can name: the window is one hour.
WINDOW_SECONDS = 3600


class ReplayLimited(LimitReached):
    """The workspace's hourly replay budget would be exceeded (HTTP 429)."""

    def __init__(self, message: str, retry_after: int | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # None: the request can never fit


@dataclass(frozen=True, slots=True)
class Spent:
    """One entry of the window: units spent, and seconds until they leave it."""

    units: int
    expires_in: float


@dataclass(frozen=True, slots=True)
class ReplayBudget:
    per_hour: int
    rows_per_unit: int = ROWS_PER_REPLAY_UNIT

    def units_for_rows(self, rows: int) -> int:
        return math.ceil(rows / self.rows_per_unit)

    def refusal(self, window: Sequence[Spent], units: int) -> ReplayLimited | None:
        """None if ``units`` fit beside ``window`` (oldest first); else the refusal,
        with the seconds until enough of the oldest spending has left the window."""
        used = sum(entry.units for entry in window)
        if used + units <= self.per_hour:
            return None
        if units > self.per_hour:
            return ReplayLimited(f"this request needs {units} replay units but the hourly limit is "
                                 f"{self.per_hour}", None)
        excess, freed = used + units - self.per_hour, 0
        retry_after = WINDOW_SECONDS  # unreachable fallback: the whole window frees `used` >= excess
        for entry in window:
            freed += entry.units
            if freed >= excess:
                retry_after = max(1, math.ceil(entry.expires_in))
                break
        return ReplayLimited(f"replay limit of {self.per_hour} per hour reached for this workspace", retry_after)
