"""The endpoint lifecycle rule (issue 24, section 2; docs/operations.md, "Endpoint lifecycle").

An *episode* runs from the breaker opening (or a pause) to the breaker closing
again (or the resume).  Within one, each stage is told to the owner once:

* ``opened`` -- failing: the breaker opened;
* ``will_pause`` -- the breaker has kept reopening since ``failing_since`` and
  the endpoint will be paused at ``failing_since + disable_after``; told
  ``warn_before`` ahead of that;
* ``paused`` -- paused (automatically at that time, or by its customer or an
  operator); its events are held, not lost;
* ``expiring`` -- held events reach ``hold_for`` at ``paused_at + hold_for``
  and become dead; told ``warn_before`` ahead of that;
* ``recovered`` -- the breaker closed again (its first success) and stayed
  closed for ``flap_window``, or the resume.

A flapping endpoint is not a storm: the episode ends (and ``recovered`` is
told) only once the breaker has stayed closed for ``flap_window``, or at once
on a resume.  A breaker that reopens within that window continues the same
episode, silently, with its ``failing_since``: it still reaches the pause.

Pure: the facts and the clock (seconds since the epoch, the database's) are
passed in; ``dispatcher.engine.notifier`` applies the decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

STAGES = ("healthy", "failing", "will_pause", "paused")
NOTICE_KINDS = ("opened", "will_pause", "paused", "expiring", "recovered")


@dataclass(frozen=True, slots=True)
class LifecyclePolicy:
    """``endpoints.*`` settings, in seconds."""

    disable_after: float = 3 * 86400.0
    warn_before: float = 86400.0
    hold_for: float = 7 * 86400.0
    flap_window: float = 900.0

    def __post_init__(self) -> None:
        for name in ("disable_after", "warn_before", "hold_for", "flap_window"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0")


@dataclass(frozen=True, slots=True)
class Facts:
    """What is known of one endpoint at ``now``."""

    breaker_closed: bool
    episode: int = 0                   # the last episode's number (0: none yet)
    running: bool = False              # the last episode has not ended
    failing_since: float | None = None  # when the running episode began
    closed_at: float | None = None     # when the running episode's breaker was first seen closed again
    paused_at: float | None = None
    sent: frozenset[str] = frozenset()  # notices already written in the running episode
    pausable: bool = True              # a customer endpoint (the operational one is never paused)


@dataclass(frozen=True, slots=True)
class Decision:
    """The endpoint's lifecycle row after ``now``, the notices due now, and whether to pause it now."""

    episode: int
    running: bool
    failing_since: float | None
    closed_at: float | None
    stage: str
    notices: tuple[str, ...] = ()
    pause: bool = False
    next_step: str | None = None       # what happens next, shown with its date
    next_step_at: float | None = None


def decide(policy: LifecyclePolicy, facts: Facts, now: float) -> Decision:
    """The lifecycle step of one endpoint at ``now``."""
    if not facts.running:
        if facts.breaker_closed and facts.paused_at is None:
            return Decision(facts.episode, False, None, None, "healthy")
        since = facts.paused_at if facts.paused_at is not None else now
        facts = replace(facts, episode=facts.episode + 1, running=True, failing_since=since, closed_at=None,
                        sent=frozenset())
    if facts.paused_at is not None:
        return _paused(policy, facts, now)
    if facts.breaker_closed:
        return _closed(policy, facts, now)
    return _failing(policy, replace(facts, closed_at=None), now)


def _due(facts: Facts, *kinds: str) -> tuple[str, ...]:
    return tuple(kind for kind in kinds if kind not in facts.sent)


def _paused(policy: LifecyclePolicy, facts: Facts, now: float) -> Decision:
    assert facts.paused_at is not None
    expires = facts.paused_at + policy.hold_for
    kinds = ["paused"]
    if now >= expires - policy.warn_before:
        kinds.append("expiring")
    return Decision(facts.episode, True, facts.failing_since, None, "paused", _due(facts, *kinds),
                    next_step="held events expire", next_step_at=expires)


def _closed(policy: LifecyclePolicy, facts: Facts, now: float) -> Decision:
    """Closed again: the episode ends once it stayed closed for flap_window, or at once after a pause (the
    resume reset the breaker)."""
    closed_at = facts.closed_at if facts.closed_at is not None else now
    if "paused" in facts.sent or now >= closed_at + policy.flap_window:
        return Decision(facts.episode, False, None, None, "healthy", _due(facts, "recovered"))
    return Decision(facts.episode, True, facts.failing_since, closed_at, "failing",
                    next_step="recovered", next_step_at=closed_at + policy.flap_window)


def _failing(policy: LifecyclePolicy, facts: Facts, now: float) -> Decision:
    opened = _due(facts, "opened")
    if not facts.pausable:
        return Decision(facts.episode, True, facts.failing_since, None, "failing", opened)
    assert facts.failing_since is not None
    pause_at = facts.failing_since + policy.disable_after
    if now >= pause_at:
        return Decision(facts.episode, True, facts.failing_since, None, "paused", opened + _due(facts, "paused"),
                        pause=True, next_step="held events expire", next_step_at=now + policy.hold_for)
    if now >= pause_at - policy.warn_before:
        return Decision(facts.episode, True, facts.failing_since, None, "will_pause",
                        opened + _due(facts, "will_pause"), next_step="paused", next_step_at=pause_at)
    return Decision(facts.episode, True, facts.failing_since, None, "failing", opened,
                    next_step="paused", next_step_at=pause_at)
