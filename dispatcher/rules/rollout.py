"""Which workspaces use the outbox: the rollout rule, once, as a pure function.

The same rule runs in SQL (``webhook_outbox_on`` and ``rollout_bucket`` in
migration 0004), and only there: in the producer's single statement
(``dispatcher_send_event``), the replay guard and the ``rollout status`` count.
No Python path shows or predicts a bucket, so nothing evaluates these
functions at run time; ``tests/e2e/test_rollout.py`` holds them and the SQL to one
table of cases.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Listed = Literal["include", "exclude"] | None


def bucket(workspace_id: str) -> int:
    """The workspace's stable bucket 0..99: the first 32 bits of md5(id) mod 100.

    md5 is used for its portability (Postgres' ``md5()`` gives the same
    digest), not for security.  A workspace in at P % is in at every P' >= P.
    """
    digest = hashlib.md5(workspace_id.encode("utf-8"), usedforsecurity=False).hexdigest()
    return int(digest[:8], 16) % 100


def outbox_on(flag: bool | None, listed: Listed, percent: int, bucket_: int) -> bool:
    """Precedence: the explicit per-workspace flag, then exclude, then include, then the percentage."""
    if flag is not None:
        return flag
    if listed == "exclude":
        return False
    if listed == "include":
        return True
    return bucket_ < percent
