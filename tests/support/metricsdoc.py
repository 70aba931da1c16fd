"""docs/metrics.md's metrics table, parsed: the contract the metrics tests and
the deploy tests (mapping, dashboard, alerts) check against."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
EMITTERS = {"worker", "leader", "worker, leader"}


@dataclass(frozen=True)
class Row:
    name: str
    tags: frozenset[str]
    kind: str
    plain: str
    plain_kind: str
    unit: str
    sent_by: str


def documented() -> list[Row]:
    """The rows of the contract table in docs/metrics.md."""
    text = DOC.read_text(encoding="utf-8")
    header = "| name | tags | type | plain name (`tags: none`) | plain type | unit | sent by |"
    assert header in text, "docs/metrics.md lost its metrics table"
    rows = []
    for line in text.split(header, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        name, tags, kind, plain, plain_kind, unit, sent_by = cells
        rows.append(Row(name.strip("`"), frozenset(re.findall(r"`(\w+)`", tags)), kind.strip("`"),
                        plain.strip("`"), plain_kind.strip("`"), unit, sent_by))
    return rows


def documented_names() -> set[str]:
    return {row.name for row in documented()}
