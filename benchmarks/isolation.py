"""``isolation`` (G5): as ``sustained``, plus one endpoint that answers 200 after
4.8 s (the incident) getting 30 % of the events and one that never answers
getting 10 %.  Target: the healthy endpoints' commit -> 2xx p99 at most 1.25x
its value in ``sustained``."""

from __future__ import annotations

from typing import Any

from benchmarks.load import run_load
from benchmarks.sustained import RATE


def run(tiny: bool = False, client: str | None = None, processes: int = 2,
        baseline: float | None = None, baseline_first: float | None = None) -> dict[str, Any]:
    if tiny:
        result = run_load(label="isolation", seconds=3.0, rate=40.0, healthy=10, slow_share=0.3, hang_share=0.1,
                          client=client, processes=processes, drain_timeout=20.0, retry={"base": "500ms"})
    else:
        result = run_load(label="isolation", seconds=60.0, rate=RATE, healthy=200, slow_share=0.3, hang_share=0.1,
                          client=client, processes=processes)
    p99 = result["healthy_commit_to_2xx"]["p99_ms"]
    result["sustained_healthy_commit_to_2xx_p99_ms"] = baseline
    ratio = round(p99 / baseline, 3) if p99 is not None and baseline else None
    result["p99_ratio_to_sustained"] = ratio
    # The same comparison for events delivered at their first attempt: the 2 %
    # that get a 500 wait ~10 s for their retry in both scenarios, so the p99
    # over all events is mostly the retry delay; this one shows the sends.
    first = result["healthy_commit_to_2xx_first_attempt"]["p99_ms"]
    result["sustained_first_attempt_commit_to_2xx_p99_ms"] = baseline_first
    first_ratio = round(first / baseline_first, 3) if first is not None and baseline_first else None
    result["first_attempt_p99_ratio_to_sustained"] = first_ratio
    result["met"] = None if ratio is None else bool(ratio <= 1.25 and result["lost"] == 0)
    result["table"] = [
        ("healthy commit->2xx p99 ms", p99, "report"),
        ("ratio to sustained p99", ratio, "<= 1.25"),
        ("healthy 1st-attempt 2xx p99 ms", first, "report"),
        ("  its ratio to sustained", first_ratio, "report (<= 1.25 wanted)"),
        ("commit->1st attempt p99 ms", result["commit_to_first_attempt"]["p99_ms"], "report"),
        ("slow endpoint max concurrency", (result["receiver"]["slow"] or {}).get("max_concurrency"),
         f"<= {4 * processes} (4 per process)"),
    ]
    return result
