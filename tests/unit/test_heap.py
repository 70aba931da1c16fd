"""A worker's collector after boot (dispatcher.runtime.heap), in a fresh interpreter each:
the test process's own collector must not change."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dispatcher.runtime.heap import YOUNG_THRESHOLD

REPO = Path(__file__).resolve().parents[2]

PROBE = r'''
import gc, json, sys, weakref
before = gc.get_threshold()
import dispatcher.engine.worker  # what a worker's boot imports
from dispatcher.runtime.heap import settle_heap
settled = settle_heap()

class Node:
    pass

# Cycles made after boot are still found by the collector's own passes (no gc.collect() here):
# three young thresholds' worth of them.
freed = []
for _ in range(3 * settled.thresholds[0]):
    node = Node()
    node.self = node
    weakref.finalize(node, freed.append, 1)
del node
print(json.dumps({"before": before, "frozen": settled.frozen, "thresholds": settled.thresholds,
                  "counted_frozen": gc.get_freeze_count(), "now": gc.get_threshold(), "freed": len(freed),
                  "made": 3 * settled.thresholds[0], "enabled": gc.isenabled()}))
'''


def probe() -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_settling_freezes_what_boot_made_and_raises_only_the_young_threshold() -> None:
    seen = probe()
    assert seen["frozen"] == seen["counted_frozen"]
    assert seen["frozen"] > 10_000   # a worker's imports: modules, classes, functions
    before = seen["before"]
    assert isinstance(before, list)
    assert seen["thresholds"] == seen["now"] == [YOUNG_THRESHOLD, before[1], before[2]]


def test_cycles_made_after_settling_are_still_collected() -> None:
    # Without an explicit collection: at most about a young threshold's worth may still wait.
    seen = probe()
    assert seen["enabled"] is True
    made, freed = seen["made"], seen["freed"]
    assert isinstance(made, int) and isinstance(freed, int)
    assert made - 2 * YOUNG_THRESHOLD <= freed <= made
