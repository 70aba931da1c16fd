"""Plans of queries over the partitioned outbox (migration 0027), read by their parents' names.

A plan over a partitioned table names each partition and each partition's own
index (``Index Scan using webhook_deliveries_p20260131_endpoint_id_next_attempt_at_idx
on webhook_deliveries_p20260131``).  :func:`canonical_plan` names them as the
parent table and the parent's index they belong to, so a test can say which
index a query uses without knowing the day the database was migrated.
"""

from __future__ import annotations

import re

from dispatcher_devtools.kit import query


def parents(dsn: str) -> dict[str, str]:
    """Each partition's name, and each of its indexes' name -> its parent's."""
    return dict(query(dsn, "SELECT c.relname, p.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                           "JOIN pg_class p ON p.oid = i.inhparent WHERE c.relispartition"))


def canonical_plan(dsn: str, plan: str) -> str:
    """``plan`` with every partition and partition index named as its parent."""
    names = parents(dsn)
    if not names:
        return plan
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
    return pattern.sub(lambda match: names[match.group(1)], plan)


def partitions_read(plan: str, table: str) -> set[str]:
    """The partitions of ``table`` a (not canonical) plan reads."""
    return set(re.findall(rf"\bon ({re.escape(table)}_(?:p[0-9]{{8}}|before|default))\b", plan))


def event_day_sql(workspace: str, event: str) -> str:
    """An SQL expression for a delivery row's ``event_day``: the day of the event (``workspace``, ``event``:
    SQL expressions), or today when there is no such event (migration 0027)."""
    return f"coalesce((SELECT e.day FROM events e WHERE e.workspace_id = {workspace} AND e.id = {event}), " \
           "dispatcher_today())"
