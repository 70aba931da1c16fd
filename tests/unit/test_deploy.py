"""The files under deploy/: alert rules (promtool), the statsd_exporter mapping,
the Grafana dashboard and the systemd units, each checked against the
contract it serves (docs/metrics.md, the config, docs/operations.md).

promtool comes from Debian's ``prometheus`` package (tests/setup.sh installs it); a
test that needs it fails when it is missing, never skips."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import load_config
from dispatcher.rules.gates import PRODUCER_P99_S
from dispatcher.rules.health import PARTITION_DAYS_AHEAD, BacklogRule
from tests.support.metricsdoc import EMITTERS, documented, documented_names

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
OPERATIONS = REPO / "docs" / "operations.md"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: apt-get install -y prometheus (tests/setup.sh does)", pytrace=False)
    return path


def alert_rules() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


# ---------------------------------------------------------------- Prometheus alerts


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(PROMETHEUS / "alerts.yml")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_fire_every_alert() -> None:
    result = subprocess.run([promtool(), "test", "rules", "alerts_test.yml"], cwd=PROMETHEUS, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case.get("exp_alerts")}
    assert fired == set(alert_rules()), "every alert needs a series that fires it"


def test_backlog_thresholds_are_the_rfcs_and_the_configs() -> None:
    rules, rule = alert_rules(), BacklogRule()
    assert rules["WebhookBacklogRows"]["expr"].endswith(f"> {rule.rows}")
    assert rules["WebhookBacklogOldest"]["expr"].endswith(f"> {rule.oldest_age:g}")
    region = load_config(REPO / "config" / "region.yaml", env={}).alerts.backlog_rule()
    assert region == rule, "config/region.yaml and the alert rules must agree"


def test_the_partitions_alert_fires_where_check_warns() -> None:
    assert alert_rules()["WebhookPartitionsRunningOut"]["expr"].endswith(f"< {PARTITION_DAYS_AHEAD}")


def test_every_alert_names_only_documented_metrics_and_has_a_runbook() -> None:
    names, runbook = documented_names(), OPERATIONS.read_text()
    for alert, rule in alert_rules().items():
        assert set(re.findall(r"\bwebhook_[a-z_]+", rule["expr"])) <= names, alert
        assert f"`{alert}`" in runbook, f"docs/operations.md does not explain {alert}"
        anchor = re.search(r"docs/operations\.md#([a-z-]+)", rule["annotations"]["description"])
        assert anchor and f"## {anchor.group(1).replace('-', ' ')}" in runbook.lower(), alert


# ---------------------------------------------------------------- statsd_exporter mapping


def _map(name: str, mappings: list[dict[str, Any]]) -> tuple[str, dict[str, str]] | None:
    """statsd_exporter's first matching regex mapping (RE2 and Python agree on these patterns)."""
    for mapping in mappings:
        if mapping.get("match_type") != "regex":
            continue
        match = re.fullmatch(mapping["match"], name)
        if match:
            def expand(text: str, groups: re.Match[str] = match) -> str:
                return re.sub(r"\$(\d)", lambda m: groups.group(int(m.group(1))), text)
            return expand(mapping["name"]), {k: expand(v) for k, v in mapping.get("labels", {}).items()}
    return None


def test_the_mapping_turns_plain_names_into_the_rfcs_names_and_labels() -> None:
    mappings = yaml.safe_load((PROMETHEUS / "statsd_mapping.yml").read_text())["mappings"]
    for row in documented():
        if row.sent_by not in EMITTERS:
            continue
        example = row.plain.replace("<p>", "dispatcher.eu-west-1")
        example = re.sub(r"<\w+>", "x42", example)
        mapped = _map(example, mappings)
        assert mapped is not None, f"no mapping for {example}"
        name, labels = mapped
        assert name == row.name, example
        assert set(labels) == row.tags and labels["region"] == "eu-west-1", (example, labels)


def test_every_leader_gauge_expires_in_both_modes() -> None:
    """Without a TTL a dead leader's last values would stay forever and hide it."""
    mappings = yaml.safe_load((PROMETHEUS / "statsd_mapping.yml").read_text())["mappings"]
    exact = {m["match"]: m for m in mappings if m.get("match_type") != "regex"}
    for row in documented():
        if row.sent_by.endswith("leader") and row.kind == "g":
            assert "ttl" in exact[row.name], row.name
            plain = row.plain.replace("<p>", "dispatcher.eu-west-1")
            plain = re.sub(r"<\w+>", "x42", plain)
            regex = next(m for m in mappings if m.get("match_type") == "regex" and re.fullmatch(m["match"], plain))
            assert "ttl" in regex, plain


def test_the_producers_outbox_write_is_a_histogram_with_the_gates_bound_in_both_modes() -> None:
    """`dispatcher gate phase0` computes the p99 from these buckets: without a bound at
    2 ms the interpolation could not tell 1.9 ms from 2.4 ms."""
    mappings = yaml.safe_load((PROMETHEUS / "statsd_mapping.yml").read_text())["mappings"]
    name = "webhook_producer_outbox_write_seconds"
    exact = next(m for m in mappings if m.get("match_type") != "regex" and m["match"] == name)
    plain = "dispatcher.eu-west-1." + name
    regex = next(m for m in mappings if m.get("match_type") == "regex" and re.fullmatch(m["match"], plain))
    assert _map(plain, mappings) == (name, {"region": "eu-west-1"})
    for mapping in (exact, regex):
        buckets = mapping["histogram_options"]["buckets"]
        assert mapping["observer_type"] == "histogram" and buckets == sorted(buckets)
        assert PRODUCER_P99_S in buckets and min(buckets) < PRODUCER_P99_S / 2


# ---------------------------------------------------------------- Grafana


def test_the_dashboard_queries_only_documented_metrics_and_shows_each_topic() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dispatcher.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    queried = {re.sub(r"_(bucket|sum|count)$", "", name) for expr in queries
               for name in re.findall(r"\bwebhook_[a-z_]+", expr)}
    assert queried <= documented_names(), queried - documented_names()
    topics = {"webhook_delivery_attempts_total", "webhook_delivery_latency_seconds", "webhook_backlog_age_seconds",
              "webhook_breakers_open", "webhook_producer_send_seconds", "webhook_workers_alive"}
    assert topics <= queried, topics - queried
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])


# ---------------------------------------------------------------- systemd


def unit(name: str) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


HARDENING = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes", "ProtectHome": "yes"}


@pytest.mark.parametrize("name", ["dispatcher.service", "dispatcher-api.service"])
def test_units_stop_gracefully_restart_on_failure_and_are_hardened(name: str) -> None:
    keys = unit(name)
    region = load_config(REPO / "config" / "region.yaml", env={})
    # The supervisor waits graceful_timeout, then 5 s more before it kills (supervisor._stop).
    assert float(keys["TimeoutStopSec"][0]) > region.workers.graceful_timeout + 5
    assert keys["KillSignal"] == ["SIGTERM"] and keys["Restart"] == ["on-failure"]
    for key, value in HARDENING.items():
        assert keys.get(key) == [value], key
    assert keys["ExecStart"][0].endswith(" run" if name == "dispatcher.service" else " api")


def test_the_dispatcher_unit_reloads_with_hup() -> None:
    assert unit("dispatcher.service")["ExecReload"] == ["/bin/kill -HUP $MAINPID"]


@pytest.mark.parametrize("name", ["dispatcher.service", "dispatcher-api.service"])
def test_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here (the unit is still checked by the test above)")
    # verify needs ExecStart's binary to exist: point it at this checkout's.
    text = (DEPLOY / "systemd" / name).read_text().replace("/opt/dispatcher/venv/bin/dispatcher",
                                                           str(REPO / "bin" / "dispatcher"))
    (tmp_path / name).write_text(text)
    result = subprocess.run([analyze, "verify", str(tmp_path / name)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
