"""notifier.mails_per_recipient_hour's rule (dispatcher.rules.mail_rate), on a table of cases."""

from __future__ import annotations

import pytest

from dispatcher.rules.mail_rate import MailRate


@pytest.mark.parametrize(("per_hour", "ages", "wait"), [
    (3, [], None),
    (3, [10.0, 20.0], None),
    (3, [10.0, 20.0, 30.0], 3570.0),             # the oldest (30 s ago) leaves the hour in 3,570 s
    (3, [30.0, 10.0, 20.0, 3000.0], 3570.0),     # order does not matter; two must leave, 30 s leaves last
    (3, [10.0, 20.0, 3600.0, 7200.0], None),     # an hour old or older: no longer counted
    (1, [0.0], 3600.0),
    (1, [], None),
])
def test_mails_wait_until_the_hour_has_room(per_hour: int, ages: list[float], wait: float | None) -> None:
    assert MailRate(per_hour).wait(ages) == wait
