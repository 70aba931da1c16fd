"""``python -m benchmarks --set section.key=value``: a setting for every scenario's engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cli import main, settings_overrides
from dispatcher.config import load_config
from dispatcher_devtools.kit.configs import BENCH_SETTINGS_ENV, bench_config, write_config


def test_each_assignment_is_a_yaml_scalar_for_its_section() -> None:
    assert settings_overrides(["workers.lane_hold=false", "workers.lane_turn=2s", "http.timeout=3"]) == {
        "workers__lane_hold": False, "workers__lane_turn": "2s", "http__timeout": 3}


@pytest.mark.parametrize("bad", ["lane_hold=false", "workers.lane_hold", ".x=1", "workers.=1"])
def test_a_malformed_assignment_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--set", bad, "--tiny", "--scenario", "hot"])
    assert exit_info.value.code == 2
    assert "expected SECTION.KEY=VALUE" in capsys.readouterr().err


def test_the_setting_wins_over_the_scenarios_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BENCH_SETTINGS_ENV, json.dumps(settings_overrides(["workers.lane_hold=false"])))
    raw = bench_config("postgresql://postgres@127.0.0.1/x", tmp_path / "log", 8125,
                       workers={"processes": 2, "lane_hold": True})
    config = load_config(write_config(tmp_path / "c.yaml", raw))
    assert config.workers.lane_hold is False and config.workers.processes == 2
