"""How a process holds an endpoint's lane: how far ahead it queues, when it asks for more,
when it lets the slots go round, and which queued rows it may still send.

A process that holds some of an endpoint's region-wide slots (``rules.limits``)
keeps them while it has due rows for that endpoint, and sends the next row as
soon as a response arrives, with no database round trip between the two
(docs/claim.md, "Holding a lane").  This value decides, from the lane's state
and the elapsed times it is given, everything that keeping involves.  Pure: no
clock of its own, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The mean attempt time a lane assumes before it has measured one (its mean is None until then).
FIRST_GUESS = 0.05
# How much one attempt moves the lane's running mean.
SMOOTHING = 0.2
# A queued row is sent only while its lease outlasts one more deadline by this much: the
# lease was stamped by the database a claim's round trip before the process saw the row.
LEASE_MARGIN = 1.0
# How long a lane holds its process's share before it takes slots its peers leave free: a peer
# serving the endpoint takes its own share within its first claims (a poll interval or two),
# so slots still free this far into the lane are slots no peer is using.
PEER_GRACE = 1.0


@dataclass(frozen=True, slots=True)
class LanePolicy:
    lease: float            # workers.lease: how long a claim's rows and slots are ours
    deadline: float         # http.timeout: the longest one attempt takes
    horizon: float = 0.25   # workers.lane_horizon: seconds of the endpoint's work queued ahead
    turn: float = 5.0       # workers.lane_turn: seconds a process keeps a lane before it lets it go round
    cap: int = 200          # rows one refill asks for at most (workers.claim_batch)
    hold: bool = True       # workers.lane_hold: False, a lane never asks for more rows

    def depth(self, slots: int, mean: float | None, budget: int) -> int:
        """Rows to keep queued for ``slots`` senders whose attempts take ``mean`` seconds
        (None: none measured yet, ``FIRST_GUESS``): ``horizon`` seconds of work, at most ``cap``
        and the lane's ``budget`` (its part of what the process may hold), and at least one row a slot."""
        per_slot = self.horizon / max(FIRST_GUESS if mean is None else mean, 1e-3)
        return max(slots, min(self.cap, budget, math.ceil(slots * per_slot)))

    def refill(self, slots: int, queued: int, mean: float | None, held_for: float, budget: int) -> int:
        """Rows to ask for now: the depth less what is queued, once the queue is down to half
        of it; none once the lane has been held for a whole ``turn``, nor when the lane's
        ``budget`` cannot queue a second row a slot (so many lanes are open that each is better
        served by the endpoint walk, which takes a slot per row and gives it back with it)."""
        if not self.hold or slots <= 0 or held_for >= self.turn or budget < 2 * slots:
            return 0
        depth = self.depth(slots, mean, budget)
        return depth - queued if queued * 2 <= depth else 0

    def budget(self, max_in_flight: int, slots: int, slots_held: int) -> int:
        """Rows a lane of ``slots`` may hold, queued and in flight: its part, by slots, of what
        the process may hold (``max_in_flight``) among the ``slots_held`` of all its lanes.  A
        process whose slots already fill half of what it may hold (a spread load: hundreds of
        endpoints keep every sender busy) leaves its lanes less than two rows a slot, so none
        queues ahead or keeps a slot past its last row (``refill``): rows there wait on the
        process, not on slots, and a lane keeping slots idle between claims would only keep them
        from the region's other processes."""
        if not self.hold:
            return 0
        return max_in_flight * slots // max(slots_held, slots, 1)

    def takes_more(self, slots: int, share: int, limit: int, held_for: float) -> bool:
        """The endpoint walk may grant the lane more slots: below its process's ``share`` always;
        past it, up to the endpoint's ``limit``, once it has held them for ``PEER_GRACE`` and
        while its turn lasts.  A process whose peers are down or still booting then serves a hot
        endpoint with every slot; a peer that comes later gets them when the turn ends."""
        if slots < share:
            return True
        return self.hold and slots < limit and PEER_GRACE <= held_for < self.turn

    def renewal_due(self, since_renewed: float) -> bool:
        """The slots' lease must be renewed (by the next claim) to outlast what is queued."""
        return since_renewed >= self.lease / 3

    def sendable(self, since_claimed: float, since_renewed: float) -> bool:
        """A queued row may still be sent: its own lease and its lane's slots outlast one more
        deadline.  Otherwise it goes back, unsent, to be claimed again."""
        left = self.lease - max(since_claimed, since_renewed)
        return left > self.deadline + LEASE_MARGIN


def running_mean(mean: float | None, seconds: float) -> float:
    """The lane's attempt time after one more attempt of ``seconds``.  The first one measured
    replaces the guess outright, as TCP's first round-trip sample does (RFC 6298, 2.2): smoothed
    from ``FIRST_GUESS``, a lane of an endpoint answering at once took 13-23 rows in each of its
    first two refills, each a planned claim, before one brought its depth (docs/benchmarks.md)."""
    if mean is None:
        return seconds
    return mean + SMOOTHING * (seconds - mean)
