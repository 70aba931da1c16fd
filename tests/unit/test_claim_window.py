"""The worker's cache of the claim's window of ids (``dispatcher.engine.worker.WindowCache``; docs/claim.md,
"The claim's window"): read at the first claim, again once it is ``CLAIM_WINDOW_REFRESH`` old by the clock it
is given, and a claim over every partition while it cannot be read."""

from __future__ import annotations

from dispatcher.engine.worker import CLAIM_WINDOW_REFRESH, WindowCache
from dispatcher.store import DatabaseUnavailable
from dispatcher.store.engine import EVERY_ID, ClaimWindow


class Reads:
    def __init__(self, *answers: ClaimWindow | Exception) -> None:
        self.answers = list(answers)
        self.count = 0

    def __call__(self) -> ClaimWindow:
        self.count += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_the_window_is_read_again_once_it_is_five_seconds_old() -> None:
    now = [100.0]
    reads = Reads(ClaimWindow(1, 10), ClaimWindow(2, 20))
    cache = WindowCache(reads, clock=lambda: now[0])
    assert CLAIM_WINDOW_REFRESH == 5.0
    assert cache.current() == ClaimWindow(1, 10) and reads.count == 1
    now[0] += CLAIM_WINDOW_REFRESH - 0.001
    assert cache.current() == ClaimWindow(1, 10) and reads.count == 1, "still fresh: no read"
    now[0] += 0.001
    assert cache.current() == ClaimWindow(2, 20) and reads.count == 2


def test_a_window_that_cannot_be_read_leaves_every_partition_in_the_claim_until_the_next_read() -> None:
    now = [0.0]
    reads = Reads(ClaimWindow(1, 10), DatabaseUnavailable("gone"), ClaimWindow(3, 30))
    cache = WindowCache(reads, clock=lambda: now[0])
    assert cache.current() == ClaimWindow(1, 10)
    now[0] += CLAIM_WINDOW_REFRESH
    assert cache.current() == EVERY_ID, "never a stale window: rows are never skipped"
    now[0] += 1.0
    assert cache.current() == EVERY_ID and reads.count == 2, "not read again before its time"
    now[0] += CLAIM_WINDOW_REFRESH
    assert cache.current() == ClaimWindow(3, 30)
