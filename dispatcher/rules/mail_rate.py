"""How many mails one address gets: ``notifier.mails_per_recipient_hour`` (issue 23, item 6).

Owner contacts are chosen by customers, so without a bound one workspace could
make the operator's relay send an address any number of notices and
confirmation requests.  Mails over the bound wait: a notice or a confirmation
is delayed, never dropped, until the oldest mail counted leaves the hour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 3600.0  # seconds: the hour of mails_per_recipient_hour


@dataclass(frozen=True, slots=True)
class MailRate:
    per_hour: int

    def wait(self, sent_ages: Sequence[float]) -> float | None:
        """None: a mail may go to the address now; else the seconds until it may.

        ``sent_ages``: how long ago (seconds) each mail to the address was sent;
        those an hour old or older no longer count."""
        recent = sorted((age for age in sent_ages if 0.0 <= age < WINDOW), reverse=True)  # oldest first
        if len(recent) < self.per_hour:
            return None
        # The oldest len - per_hour + 1 mails must leave the hour; the last of them leaves latest.
        return WINDOW - recent[len(recent) - self.per_hour]
