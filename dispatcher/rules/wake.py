"""When an idle worker claims before its poll: new rows may have become visible.

Between claims an idle worker reads, every ``workers.wake_interval``, a *mark*:
the outbox's id sequence (every new row, the producer's or a replay's, moves it)
and the transactions in progress.  It claims at once when the sequence moved,
and again when a transaction that was in progress at such a move has ended: its
rows were numbered before they could be seen, and a claim made at the move
found none of them (docs/claim.md, "Waking for new rows").  Rows that fall due
by time (retries, a resumed endpoint) still wait for the poll.

Pure: the mark is an argument, nothing is read here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WakeMark:
    """One reading: the id sequence's last value and the transaction ids in progress."""

    last_id: int
    in_progress: frozenset[int]


@dataclass(frozen=True, slots=True)
class WakeWatch:
    """What the worker has seen: the sequence's value at its last reading (None: none yet) and
    the transactions in progress when the sequence last moved, that are still running."""

    seen: int | None = None
    waiting: frozenset[int] = frozenset()

    def after(self, mark: WakeMark) -> tuple[WakeWatch, bool]:
        """The watch after ``mark``, and whether to claim now."""
        if mark.last_id != self.seen:
            # New ids (or a first reading, after which anything may be new): their transactions
            # are among those in progress now unless they have committed, and a claim sees those.
            return WakeWatch(mark.last_id, mark.in_progress), True
        still = self.waiting & mark.in_progress
        # One of them ended: it may have committed rows numbered before the last claim saw them.
        return WakeWatch(self.seen, still), still != self.waiting
