"""Structured events in the dispatcher's log lines.

Lines that tests key on carry a stable ``event=NAME`` token (``worker_started``,
``worker_restarting``, ...), so a test can assert that something did *not*
happen without depending on the wording of a message.
"""

from __future__ import annotations

import re
from collections import Counter

_EVENT = re.compile(r"\bevent=([a-z][a-z0-9_]*)\b")


def log_events(log: str) -> Counter[str]:
    """How often each ``event=NAME`` appears in ``log``."""
    return Counter(_EVENT.findall(log))


def assert_no_event(log: str, event: str, *, control: str = "supervisor_started") -> None:
    """``event`` never appears in ``log``, while ``control`` does: the positive
    control shows the log carries event keys at all, so this absence check can fail."""
    events = log_events(log)
    assert events[control], f"no event={control} in the log: the check for event={event} would prove nothing"
    assert not events[event], f"event={event} logged {events[event]} time(s):\n{log[-3000:]}"
