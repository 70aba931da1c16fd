"""What the dispatcher's database sessions did, counted from ``pg_stat_activity``.

A test that asserts an absence ("no second upkeep leader", "no POST while the
breaker is open") must first show that the thing had its chance: the loops that
could have done it ran.  Sleeping "long enough" shows nothing on a slow machine.
Every worker names its sessions ``dispatcher <purpose> <owner>`` (``claim``,
``record``, ``upkeep``, ``status``, ``notify``) and runs each statement in its own
transaction, so each statement it finishes leaves its session ``idle`` with a new
``state_change``.  :class:`SessionActivity` counts those, per session, from a
baseline taken when it is made; the product needs no hook for it.

A poll sees a session's newest statement only: two finished between polls count
once, so every count is a lower bound and a wait for N is a wait for at least N.
Behind a transaction pooler a server session shows its last client's name, which
the pooler sets before that client's statements: the count still holds.
"""

from __future__ import annotations

from datetime import datetime

from dispatcher_devtools.kit.database import query
from dispatcher_devtools.kit.waiting import wait_until

_IDLE_SESSIONS = ("SELECT application_name, pid, state_change FROM pg_stat_activity "
                  "WHERE datname = current_database() AND state = 'idle' AND state_change IS NOT NULL "
                  "AND application_name LIKE %s AND strpos(query, %s) > 0")


class SessionActivity:
    """Statements finished by the dispatcher sessions of one purpose, per session name."""

    def __init__(self, dsn: str, purpose: str, statement: str = "", owner: str = "") -> None:
        """Count the sessions named ``dispatcher <purpose> <owner>`` (any owner, if empty) whose
        finished statement's text holds ``statement`` (any, if empty); what they had done before
        is the baseline.  A session that runs several statements a round (the upkeep leader's)
        rarely rests on a given one: name its owner and count all its statements instead."""
        self._dsn = dsn
        self._purpose = f"{purpose} {owner}" if owner else purpose
        self._pattern = f"dispatcher {purpose} {owner or '%'}"
        self._statement = statement
        self._baseline: set[tuple[str, int, datetime]] = set(self._sample())
        self._seen: dict[str, set[tuple[int, datetime]]] = {}

    def _sample(self) -> list[tuple[str, int, datetime]]:
        return [(str(name), int(pid), changed)
                for name, pid, changed in query(self._dsn, _IDLE_SESSIONS, (self._pattern, self._statement))]

    def counts(self) -> dict[str, int]:
        """Poll once; how many statements each session has been seen to finish since the baseline."""
        for name, pid, changed in self._sample():
            if (name, pid, changed) not in self._baseline:
                self._seen.setdefault(name, set()).add((pid, changed))
        return {name: len(changes) for name, changes in self._seen.items()}

    def wait_for(self, statements: int, sessions: int = 1, timeout: float = 30.0) -> dict[str, int]:
        """Poll until ``sessions`` sessions have each finished ``statements`` statements since the
        baseline; the counts.  :class:`WaitTimeout` at the bound names what was seen."""
        last: dict[str, int] = {}

        def done() -> bool:
            nonlocal last
            last = self.counts()
            return sum(n >= statements for n in last.values()) >= sessions

        what = (f"{sessions} 'dispatcher {self._purpose}' session(s) to finish {statements} statement(s)"
                + (f" holding {self._statement!r}" if self._statement else ""))
        try:
            wait_until(done, timeout=timeout, interval=0.05, message=what)
        except AssertionError as exc:
            raise type(exc)(f"{exc}; seen so far: {last}") from None
        return last
