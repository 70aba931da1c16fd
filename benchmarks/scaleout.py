"""``scaleout``: the throughput drain on one database, first by one supervisor with N
worker processes, then by two supervisors with N/2 each, as two hosts would run it.

Each supervisor is its own ``dispatcher run`` process group with its own config
and log; its workers' owner ids (``host:supervisor-pid:wN``, the ``locked_by``
of their leases) differ from the other's, as two hosts' would.  What the two
supervisors do not have here is CPUs of their own: on one machine the split
shows what coordination through the database costs, not what a second host adds.

Claim conflicts, counted from outside (the engine has no claim counter):

* ``fence_rejected``: results refused by the claim-token fence, i.e. rows
  whose lease lapsed and was taken by another worker (the workers' warning);
* ``resent``: attempt rows beyond one per delivery (every answer is 200, so
  a second attempt means a row was claimed twice);
* ``duplicates``: POSTs of a delivery id the receiver had already seen.

The claim itself cannot wait on another claimer (``FOR UPDATE SKIP LOCKED``
rows, a try-lock per endpoint lane), so contention that does not produce one
of the above shows only as throughput.  Target: every row delivered once, and
the two-supervisor rate at least 0.9x the one-supervisor rate.
"""

from __future__ import annotations

from typing import Any

from benchmarks.throughput import drain

TARGET_RATIO = 0.9


def _drain(supervisors: int, **kwargs: Any) -> dict[str, Any]:
    """The throughput drain by ``supervisors`` supervisors, in figures that compare."""
    run = drain(supervisors=supervisors, **kwargs)
    receiver = run["receiver"]
    return {
        "supervisors": run["supervisors"],
        "owners": run["owners"],
        "processes_per_supervisor": run["worker_processes"] // run["supervisors"],
        "deliveries": run["deliveries"],
        "deliveries_per_s": run["deliveries_per_s"],
        "fence_rejected": run["log"]["fence_rejected"],
        "resent": run["attempt_rows"] - run["deliveries"],
        "duplicates": receiver["duplicates"],
        "lost": run["lost"],
        "cpu_ms_per_delivery": run["cpu_ms_per_delivery"],
        "others_cores": run["machine"]["others_cores"],
        "load_average_before": run["load_average_before"],
    }


def run(tiny: bool = False, client: str | None = None, processes: int = 2) -> dict[str, Any]:
    if processes < 2 or processes % 2:
        raise ValueError(f"scaleout needs an even number of worker processes, not {processes}")
    events = 50 if tiny else 20_000
    workspaces = 10 if tiny else 100
    common = {"events": events, "workspaces": workspaces, "client": client, "processes": processes}
    one = _drain(1, label="scaleout_one", **common)
    two = _drain(2, label="scaleout_two", **common)
    ratio = round(two["deliveries_per_s"] / one["deliveries_per_s"], 3) \
        if one["deliveries_per_s"] and two["deliveries_per_s"] else None
    conflicts = {key: one[key] + two[key] for key in ("fence_rejected", "resent", "duplicates")}
    result: dict[str, Any] = {
        "worker_processes": processes,
        "one_supervisor": one,
        "two_supervisors": two,
        "ratio_two_to_one": ratio,
        "target_ratio": TARGET_RATIO,
        "conflicts": conflicts,
        "lost": one["lost"] + two["lost"],
    }
    result["met"] = bool(ratio is not None and ratio >= TARGET_RATIO and result["lost"] == 0
                         and not any(conflicts.values()))
    half = processes // 2
    result["table"] = [
        (f"deliveries/s 1 x {processes}", one["deliveries_per_s"], "report"),
        (f"deliveries/s 2 x {half}", two["deliveries_per_s"], "report"),
        ("ratio 2 supervisors / 1", ratio, f">= {TARGET_RATIO}"),
        ("fence-rejected 1 / 2 supervisors", f"{one['fence_rejected']} / {two['fence_rejected']}", "0"),
        ("re-sent rows 1 / 2 supervisors", f"{one['resent']} / {two['resent']}", "0"),
        ("receiver duplicates 1 / 2", f"{one['duplicates']} / {two['duplicates']}", "0"),
        ("lost", result["lost"], "0"),
    ]
    return result
