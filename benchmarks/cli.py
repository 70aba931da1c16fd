"""``python -m benchmarks [--scenario NAME ...] [--json] [--tiny]``.

Prints one JSON object per scenario (one line each with ``--json``, indented
otherwise) and then a readable table of each figure against its target.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from benchmarks.harness import load_average, machine
from dispatcher_devtools.kit.configs import BENCH_SETTINGS_ENV

SCENARIOS: tuple[str, ...] = ("ceiling", "throughput", "sustained", "isolation", "producer", "outage", "backlog",
                               "tls", "failover", "internet", "scaleout", "peer", "dbcost", "hot", "fairness",
                               "tracing", "partitions")
# Run only when named (or with --tiny): at its default sizes ``partitions`` writes 50 M rows (an hour, tens of GB).
ON_REQUEST: tuple[str, ...] = ("partitions",)


def _runner(name: str) -> Callable[..., dict[str, Any]]:
    module = importlib.import_module(f"benchmarks.{name}")
    return module.run  # type: ignore[no-any-return]


def run_scenario(name: str, *, tiny: bool = False, client: str | None = None, processes: int = 2,
                 context: dict[str, Any] | None = None, max_per_second: float | None = None,
                 duration: float | None = None, max_in_flight: int | None = None, receiver: str = "mock",
                 rounds: int = 1, events: int | None = None, pairs: int | None = None,
                 partition_sizes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one scenario; ``context`` carries figures between scenarios of one invocation."""
    context = context if context is not None else {}
    kwargs: dict[str, Any] = {"tiny": tiny}
    if name in ("throughput", "sustained", "isolation", "outage", "tls", "internet", "scaleout", "peer", "hot",
                "tracing"):
        kwargs["client"] = client
        kwargs["processes"] = processes
    if name == "internet":
        kwargs["seconds"] = duration
        kwargs["max_in_flight"] = max_in_flight
    if name in ("throughput", "hot"):
        kwargs["receiver"] = receiver
    if name == "throughput":
        kwargs["ceiling"] = context.get("ceiling")
        kwargs["max_per_second"] = max_per_second
    if name == "peer":
        kwargs["rounds"] = rounds
    if name == "tracing":
        kwargs["events"] = events
        kwargs["pairs"] = pairs
    if name == "isolation":
        kwargs["baseline"] = context.get("sustained_healthy_p99_ms")
        kwargs["baseline_first"] = context.get("sustained_first_attempt_p99_ms")
    if name == "backlog":
        kwargs["throughput_outbox"] = context.get("throughput_outbox")
    if name == "partitions":
        kwargs.update(partition_sizes or {})
    started = time.monotonic()
    load = load_average()
    try:
        result = _runner(name)(**kwargs)
    except Exception as exc:  # one broken scenario must not hide the others' figures
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=6), "met": False}
    result = {"scenario": name, **result, "wall_s": round(time.monotonic() - started, 1),
              "load_average_at_start": load}
    if name == "ceiling" and result.get("bare_loop", {}).get("deliveries_per_s"):
        context["ceiling"] = result["bare_loop"]["deliveries_per_s"]
    if name == "sustained" and result.get("healthy_commit_to_2xx"):
        context["sustained_healthy_p99_ms"] = result["healthy_commit_to_2xx"].get("p99_ms")
        context["sustained_first_attempt_p99_ms"] = result["healthy_commit_to_2xx_first_attempt"].get("p99_ms")
    if name == "throughput" and "outbox_after" in result:
        context["throughput_outbox"] = {"outbox_after": result["outbox_after"],
                                        "outbox_timeline": result.get("outbox_timeline"),
                                        "deliveries": result.get("deliveries"),
                                        "seconds": result.get("seconds")}
    return result


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(scenario, figure, measured, target) rows for the readable table."""
    name = result["scenario"]
    if "error" in result:
        return [(name, "error", result["error"][:70], "")]
    rows: list[tuple[str, str, str, str]] = []
    for figure, measured, target in result.get("table", []):
        rows.append((name, figure, _fmt(measured), target))
    met = result.get("met")
    rows.append((name, "target met", "-" if met is None else ("yes" if met else "NO"), ""))
    return rows


def print_table(results: Sequence[dict[str, Any]], out: Any = None) -> None:
    out = out or sys.stdout
    rows = [("scenario", "figure", "measured", "target")]
    for result in results:
        rows.extend(table_rows(result))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip(), file=out)
        if index == 0:
            print("  ".join("-" * w for w in widths), file=out)


def settings_overrides(assignments: Sequence[str]) -> dict[str, Any]:
    """``section.key=value`` strings as config overrides (a YAML scalar each: ``false``, ``0.5``, ``5s``)."""
    overrides: dict[str, Any] = {}
    for assignment in assignments:
        dotted, equals, text = assignment.partition("=")
        section, dot, key = dotted.partition(".")
        if not (equals and dot and section and key):
            raise ValueError(f"--set {assignment!r}: expected SECTION.KEY=VALUE, e.g. workers.lane_hold=false")
        overrides[f"{section}__{key}"] = yaml.safe_load(text) if text else ""
    return overrides


def _count(text: str) -> int:
    from benchmarks.partitions import parse_count

    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _counts(text: str) -> list[int]:
    return [_count(part) for part in text.split(",") if part.strip()] or [_count(text)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", choices=SCENARIOS,
                        help="run only this scenario (repeatable); default: all but partitions, in table order")
    parser.add_argument("--json", action="store_true", help="one compact JSON object per line")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the smoke test); figures mean nothing")
    parser.add_argument("--client", choices=("urllib3", "geventhttpclient"),
                        help="http.client for the engine scenarios (default: the config default)")
    parser.add_argument("--processes", type=int, default=2, help="dispatcher worker processes (default: 2)")
    parser.add_argument("--machine", action="store_true", help="also print a JSON object describing the machine")
    parser.add_argument("--max-per-second", type=float, default=None,
                        help="throughput: give every endpoint this rate limit (what the limit costs)")
    parser.add_argument("--duration", type=float, default=None,
                        help="internet: seconds of offered load in the faulty phase (default: "
                             "$BENCH_INTERNET_SECONDS, else 300)")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="internet: the workers' max_in_flight (default: the config default)")
    parser.add_argument("--receiver", choices=("mock", "nginx"), default="mock",
                        help="throughput and hot's spread case: the receiver (mock: verifies signatures; nginx: "
                             "Debian's nginx answering 204, as the peer scenario uses)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="peer: how many times to run the order peer, ours, ours, peer after the sweep of "
                             "the peer's tunings (default: 1)")
    parser.add_argument("--events", type=int, default=None,
                        help="tracing: events per drain (default 2,000, a tenth of W1; 20000 is W1's size)")
    parser.add_argument("--pairs", type=int, default=None,
                        help="tracing: alternating off/on pairs after the discarded warm-up drain (default 3)")
    parser.add_argument("--partitions-pending", type=_count, default=None, metavar="ROWS",
                        help="partitions: pending rows in today's partition (default 100k; 1M, 2_000_000 work)")
    parser.add_argument("--partitions-totals", type=_counts, default=None, metavar="ROWS,ROWS",
                        help="partitions: the outbox sizes the claim is measured at (default 10M,50M)")
    parser.add_argument("--partitions-day-rows", type=_count, default=None, metavar="ROWS",
                        help="partitions: rows in the day partition dropped vs deleted (default 1M)")
    parser.add_argument("--partitions-week-rows", type=_count, default=None, metavar="ROWS",
                        help="partitions: rows a day in the simulated week, 10 days kept 7 (default 500k)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a dispatcher setting for every scenario's engine, applied last (repeatable), "
                             "e.g. --set workers.lane_hold=false: the before of a before/after")
    args = parser.parse_args(argv)
    try:
        os.environ[BENCH_SETTINGS_ENV] = json.dumps(settings_overrides(args.set))
    except ValueError as exc:
        parser.error(str(exc))
    if args.max_in_flight is not None and args.max_in_flight < 1:
        parser.error("--max-in-flight must be a positive number")
    if args.rounds < 1:
        parser.error("--rounds must be a positive number")
    if args.events is not None and args.events < 1:
        parser.error("--events must be a positive number")
    if args.pairs is not None and args.pairs < 1:
        parser.error("--pairs must be a positive number")
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration must be a positive number of seconds")
    names = args.scenario or [name for name in SCENARIOS if args.tiny or name not in ON_REQUEST]
    if args.machine:
        print(json.dumps({"machine": machine()}))
    context: dict[str, Any] = {}
    results = []
    for name in names:
        result = run_scenario(name, tiny=args.tiny, client=args.client, processes=args.processes, context=context,
                              max_per_second=args.max_per_second, duration=args.duration,
                              max_in_flight=args.max_in_flight, receiver=args.receiver, rounds=args.rounds,
                              events=args.events, pairs=args.pairs,
                              partition_sizes={"pending": args.partitions_pending, "totals": args.partitions_totals,
                                               "day_rows": args.partitions_day_rows,
                                               "week_rows": args.partitions_week_rows})
        results.append(result)
        print(json.dumps(result, default=str) if args.json else json.dumps(result, indent=2, default=str),
              flush=True)
    print()
    print_table(results)
    return 0 if all(r.get("met") is not False for r in results) or args.tiny else 1
