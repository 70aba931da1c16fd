"""A worker's cyclic garbage collector, set once its boot is done (docs/benchmarks.md, "The collector").

A worker's garbage is freed by reference counting almost entirely: in a
100,000-delivery drain its young collections found 950 objects in cycles, yet
CPython's default passes cost it about 7 % of its CPU.  A young pass ran every
700 net allocations of container objects and walked whatever a claim still
held alive; every tenth middle pass was a full one, and each full pass walked
the 42,000 objects that boot left behind (modules, classes, functions; more
with OpenTelemetry), 23 to 32 ms each.  So, once boot is over:

* what boot made is frozen (``gc.freeze``): it lives as long as the process,
  and no later pass walks it again;
* a young pass waits for ``YOUNG_THRESHOLD`` net allocations.  Objects that die
  by reference counting before then (a request's, an attempt's) are never
  walked, and fewer survivors are promoted to the older generations.  Cycles
  still get collected, later, so whatever a cycle holds stays that much longer:
  the transport breaks the one a failed attempt made (its deadline and its
  traceback), which had cost the ``internet`` benchmark's workers 12 MB more at
  their peak (77 MB against 65) until it did.

Only a worker process does this (``worker_main``): a producer's or a test's
process keeps its own collector as it is.
"""

from __future__ import annotations

import gc
from typing import NamedTuple

YOUNG_THRESHOLD = 10_000   # CPython's default is 700


class SettledHeap(NamedTuple):
    frozen: int                          # objects moved to the permanent generation
    thresholds: tuple[int, int, int]     # the collector's thresholds from now on


def settle_heap(young_threshold: int = YOUNG_THRESHOLD) -> SettledHeap:
    """Collect once, freeze what is left, and raise the young generation's threshold;
    the middle and old thresholds stay CPython's."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
    young, middle, old = gc.get_threshold()
    return SettledHeap(gc.get_freeze_count(), (young, middle, old))
