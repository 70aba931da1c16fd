"""Every benchmark scenario at a tiny size: it runs, it reports its figures,
and nothing is lost.  No timing is asserted: figures at this size mean
nothing, and CI machines are shared."""

from __future__ import annotations

import statistics
from typing import Any

import psycopg2
import pytest

from benchmarks.cli import SCENARIOS, print_table, run_scenario
from benchmarks.harness import server_dsn
from benchmarks.peer import missing_tools

# Each scenario runs in the first test that asks for it (peer: 6 toy drains, hot: 7), within that test's timeout.
pytestmark = pytest.mark.timeout(300)

KEYS = {
    "ceiling": {"transports", "receiver", "bare_loop"},
    "throughput": {"deliveries_per_s", "cpu_ms_per_delivery", "ratio_to_ceiling", "outbox_after", "statsd", "log"},
    "sustained": {"produced_ratio", "achieved_ratio", "backlog_age", "commit_to_first_attempt",
                  "healthy_commit_to_2xx"},
    "isolation": {"healthy_commit_to_2xx", "p99_ratio_to_sustained", "receiver"},
    "producer": {"added_p50_ms", "added_p99_ms", "send_call", "baseline_txn"},
    "outage": {"dead_after_s", "recovered_rows", "received_events"},
    "backlog": {"sizes", "claim_cost_ratio_1m_to_10k", "after_drain"},
    "tls": {"deliveries_per_s", "plain_deliveries_per_s", "ratio_to_plain", "tls_handshakes",
            "handshakes_per_endpoint", "cpu_ms_per_delivery"},
    "failover": {"runs", "duplicates", "supervisor_restarts", "worker_restarts"},
    "internet": {"commit_to_first_attempt", "healthy_p99_ratio_to_baseline", "breakers_opened", "worker_rss_mb",
                 "worker_open_fds", "max_in_flight_limited", "met_by_target", "faulty", "baseline"},
    "scaleout": {"one_supervisor", "two_supervisors", "ratio_two_to_one", "conflicts"},
    "peer": {"runs", "order", "ours_median_per_s", "peer_median_per_s", "ratio", "versions", "peer_tuning",
             "sweep"},
    "dbcost": {"postgres_cpu_ms_per_delivery", "claim_cpu_ms_per_delivery", "record_cpu_ms_per_delivery",
               "wal_bytes_per_delivery", "outbox_hot_updates"},
    "hot": {"one_endpoint_10ms", "one_endpoint_fast", "spread_100_vs_1000", "hot_among_999", "errors"},
    "fairness": {"alone", "during_storm", "p50_ratio", "p99_ratio", "storm", "api_rss"},
    "tracing": {"deliveries_per_s_off", "deliveries_per_s_on", "throughput_cost", "otlp_exports", "pair_costs",
                "postgres_cpu_ms_per_delivery_on",
                "dispatcher_cpu_ms_per_delivery_on"},
    "partitions": {"sizes", "claim", "retention", "week", "errors"},
}
# Scenarios that need what pip's test extra does not bring: why each cannot run here, or None.
NEEDS = {"peer": missing_tools}


class Results(dict[str, dict[str, Any]]):
    """Each scenario's tiny result, run the first time a test asks for it (so ``-k hot`` runs only
    ``hot``); figures carried between scenarios flow in the order they ran, as in the CLI."""

    def __init__(self) -> None:
        super().__init__()
        self.context: dict[str, Any] = {}

    def __missing__(self, name: str) -> dict[str, Any]:
        reason = NEEDS[name]() if name in NEEDS else None
        result: dict[str, Any] = {"scenario": name, "skipped": reason} if reason else \
            run_scenario(name, tiny=True, context=self.context)
        self[name] = result
        return result


@pytest.fixture(scope="module")
def results(pg_server_dsn: str, monkeypatch_module: pytest.MonkeyPatch) -> Results:
    monkeypatch_module.setenv("BENCH_PG_DSN", pg_server_dsn)
    return Results()


@pytest.fixture(scope="module")
def monkeypatch_module():  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_reports_its_figures_and_loses_nothing(results: dict[str, dict], name: str) -> None:
    result = results[name]
    if "skipped" in result:
        pytest.skip(result["skipped"])
    assert "error" not in result, result.get("traceback")
    assert KEYS[name] <= set(result), sorted(KEYS[name] - set(result))
    assert result["scenario"] == name and "met" in result and result["table"]
    assert result["lost"] == 0


def test_engine_scenarios_used_every_feature(results: dict[str, dict]) -> None:
    throughput = results["throughput"]
    assert throughput["statuses"] == {"delivered": throughput["deliveries"]}
    assert throughput["attempt_rows"] == throughput["deliveries"], "attempt history"
    assert throughput["receiver"]["bad_signatures"] == 0 and throughput["receiver"]["ok"] == throughput["deliveries"]
    assert throughput["statsd"]["lines"] > 0, "metrics reached the UDP sink"
    assert throughput["log"]["attempt_lines"] == throughput["deliveries"], "one INFO line per attempt"
    assert results["outage"]["recovered_rows"] == results["outage"]["events"]
    tls = results["tls"]["tls_run"]
    assert tls["tls"] and tls["statuses"] == {"delivered": tls["deliveries"]}
    assert tls["receiver"]["bad_signatures"] == 0 and tls["receiver"]["ok"] == tls["deliveries"]
    # Keep-alive holds: the engine's pools handshake once per connection, far fewer than deliveries.
    assert 1 <= results["tls"]["tls_handshakes"] < tls["deliveries"]


def test_the_table_prints(results: dict[str, dict], capsys: pytest.CaptureFixture[str]) -> None:
    ran = [result for result in results.values() if "skipped" not in result]
    print_table(ran)
    out = capsys.readouterr().out
    for result in ran:
        assert result["scenario"] in out


def test_peer_alternates_both_systems_and_every_request_carried_its_signature(results: dict[str, dict]) -> None:
    result = results["peer"]
    if "skipped" in result:
        pytest.skip(result["skipped"])
    assert result["order"] == ["peer", "ours", "ours", "peer"]
    for run in result["runs"]:
        assert run["deliveries"] > 0 and run["lost"] == run["duplicates"] == run["unexpected"] == 0, run["system"]
        assert run["requests"] == run["deliveries"] and run["statuses"] == {"204": run["deliveries"]}
        assert run["signature_headers_missing"] == run["id_mismatch"] == 0
        assert run["deliveries_per_s"] and run["cpu_s"]["senders"] > 0 and run["cpu_s"]["receiver"] >= 0
    peers = [run for run in result["runs"] if run["system"] == "peer"]
    assert all(run["pgqueuer_log"]["successful"] == run["deliveries"] and run["jobs_left"] == 0 for run in peers)
    assert result["ratio"] is not None


def test_peer_reports_the_servers_shared_buffers(results: dict[str, dict]) -> None:
    # The ratio depends on it (docs/benchmarks.md, "Why hosts rank the engines differently").
    result = results["peer"]
    if "skipped" in result:
        pytest.skip(result["skipped"])
    conn = psycopg2.connect(server_dsn())
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW shared_buffers")
            (shown,) = cur.fetchone()
    finally:
        conn.close()
    assert result["postgres_shared_buffers"] == shown
    assert any(line[0].startswith("Postgres shared_buffers") and line[1] == shown for line in result["table"])


def test_peer_sweeps_its_tunings_and_runs_the_best(results: dict[str, dict]) -> None:
    result = results["peer"]
    if "skipped" in result:
        pytest.skip(result["skipped"])
    points = result["sweep"]["points"]
    assert [(p["batch_size"], p["max_concurrent_tasks"]) for p in points] == [(50, 100), (500, 1000)]
    for point in points:
        assert "error" not in point, point
        assert point["deliveries"] == result["sweep"]["deliveries"] > 0 and point["deliveries_per_s"]
        assert point["lost"] == point["duplicates"] == 0
    best = result["sweep"]["best"]
    assert best["deliveries_per_s"] == max(p["deliveries_per_s"] for p in points)
    chosen = {"batch_size": best["batch_size"], "max_concurrent_tasks": best["max_concurrent_tasks"]}
    assert chosen.items() <= result["peer_tuning"].items()
    for run in result["runs"]:
        if run["system"] == "peer":
            assert run["tuning"] == result["peer_tuning"]


def test_hot_measures_each_case_against_its_baseline_in_the_same_run(results: dict[str, dict]) -> None:
    hot = results["hot"]
    assert hot["errors"] == [], [hot[name].get("traceback") for name in hot["errors"]]
    for name in ("one_endpoint_10ms", "one_endpoint_fast"):
        case = hot[name]
        assert len(case["ceiling_probes_per_s"]) == 2 and min(case["ceiling_probes_per_s"]) > 0, name
        assert case["groups"]["hot"]["delivered"] == case["pending"] > 0 and case["lost"] == 0
        assert case["ratio_to_ceiling"] is not None and case["log"]["attempt_lines"] == case["pending"]
    assert 1 <= hot["one_endpoint_10ms"]["max_concurrency"], "the mock counted requests in flight"
    spread = hot["spread_100_vs_1000"]
    assert spread["order"] == ["endpoints_100", "endpoints_1000", "endpoints_1000", "endpoints_100"]
    for key, endpoints in (("endpoints_100", 100), ("endpoints_1000", 1000)):
        assert [run["endpoints"] for run in spread[key]] == [endpoints, endpoints]
        for run in spread[key]:
            assert run["statuses"] == {"delivered": run["deliveries"]} and run["deliveries"] > 0
    among = hot["hot_among_999"]
    assert among["order"] == ["without_hot", "with_hot", "with_hot", "without_hot"]
    assert len(among["without_hot"]) == len(among["with_hot"]) == len(among["pair_time_ratios"]) == 2
    assert among["time_ratio_with_to_without"] == pytest.approx(statistics.median(among["pair_time_ratios"]),
                                                                abs=0.001)
    for alone, beside in zip(among["without_hot"], among["with_hot"], strict=True):
        assert set(alone["groups"]) == {"others"} and set(beside["groups"]) == {"others", "hot"}
        assert alone["groups"]["others"]["rows"] == beside["groups"]["others"]["rows"] == \
            999 * among["others_pending_each"]
        assert beside["groups"]["hot"]["rows"] == among["hot_pending"]
    assert among["others_seconds_with_hot"] and among["others_seconds_without_hot"]
    assert among["max_concurrency_any_endpoint"] >= 1 and among["max_concurrency_hot"] >= 1


def test_internet_runs_every_endpoint_class_and_a_healthy_baseline(results: dict[str, dict]) -> None:
    faulty, baseline = results["internet"]["faulty"], results["internet"]["baseline"]
    assert set(faulty["endpoint_classes"]) == {"healthy", "error", "hang", "refuse", "drip"}
    assert set(baseline["endpoint_classes"]) == {"healthy"}
    for phase in (faulty, baseline):
        assert phase["drained"] and phase["healthy_delivered"] == phase["healthy_deliveries"] > 0
        assert phase["worker_samples"], "worker RSS and descriptors were sampled"
    # Each faulty class was attempted and failed the way it should.
    assert faulty["statuses"].get("pending", 0) + faulty["statuses"].get("dead", 0) > 0
    assert faulty["log"]["attempt_lines"] > faulty["healthy_deliveries"]


def test_scaleout_ran_two_supervisors_with_their_own_owner_ids(results: dict[str, dict]) -> None:
    one, two = results["scaleout"]["one_supervisor"], results["scaleout"]["two_supervisors"]
    supervisor_pids = [{owner.split(":")[1] for owner in run["owners"]} for run in (one, two)]
    assert [len(pids) for pids in supervisor_pids] == [1, 2]
    assert len(one["owners"]) == len(two["owners"]) == results["scaleout"]["worker_processes"]
    assert one["deliveries"] == two["deliveries"] > 0


def test_fairness_times_the_neighbour_alone_and_during_the_storm(results: dict[str, dict]) -> None:
    fairness = results["fairness"]
    assert fairness["storm"]["answers"] >= fairness["storm"]["clients"] and fairness["storm"]["not_200_or_429"] == 0
    for phase in ("alone", "during_storm"):
        assert fairness[phase]["neighbour"]["n"] > 0 and fairness[phase]["healthz"]["n"] > 0
    assert fairness["api_rss"]["peak_mb"] > 0


def test_partitions_measures_each_size_and_both_kinds_of_retention(results: dict[str, dict]) -> None:
    result = results["partitions"]
    assert result["errors"] == [], [result[name].get("traceback") for name in result["errors"]]
    steps = result["claim"]["steps"]
    assert [s["outbox_rows"] for s in steps] == [result["sizes"]["pending"], *result["sizes"]["totals"]]
    assert all(s["claims"] > 0 and s["rows_per_claim"] > 0 for s in steps), "every size claimed rows"
    largest = steps[-1]
    # The window keeps the claim off the month of delivered partitions: it reads today's and DEFAULT.
    read = largest["explain"]["partitions_read"]
    assert read and len(read) < largest["partitions"] - 20, read
    assert len(largest["explain_without_window"]["partitions_in_plan"]) > len(largest["explain"]["partitions_in_plan"])
    retention = result["retention"]
    assert retention["delete"]["rows"] == retention["rows"] and retention["rows_left_in_copy"] == 0
    assert retention["drop"]["wal_bytes"] >= 0 and retention["delete"]["statements"] >= 1
    week = result["week"]
    kept = week["retained_days"] * week["rows_per_day"]
    assert week["partitioned"]["rows"] == week["unpartitioned"]["rows"] == kept
    assert week["partitioned"]["retention_rounds"] == week["unpartitioned"]["retention_rounds"] == \
        week["days"] - week["retained_days"]
