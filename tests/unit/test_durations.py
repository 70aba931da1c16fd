"""The one duration syntax (``dispatcher.durations``), and how each of its callers answers bad input:
the configuration with a ``ConfigError``, ``gate --since`` with a ``UsageError``, the API with a 400."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import falcon.testing
import pytest

from dispatcher.api import params
from dispatcher.api.problems import Problem
from dispatcher.cli.gate import parse_when, window_of
from dispatcher.config import ConfigError
from dispatcher.config import parse_duration as config_duration
from dispatcher.durations import DurationError, format_duration, parse_duration
from dispatcher.rules.gates import Window
from dispatcher.runtime.exitcodes import UsageError

ACCEPTED = [("100ms", 0.1), ("250ms", 0.25), ("10s", 10.0), ("1.5s", 1.5), ("5m", 300.0), ("24h", 86400.0),
            ("30d", 2592000.0), (" 10s ", 10.0), ("10 s", 10.0), ("0.5h", 1800.0)]
REFUSED: list[Any] = ["10", "10x", "-5s", "0ms", "", "s", "1e3s", "ten s", "1.s", ".5s", "5 minutes", "10S",
                      "\u0661\u0660s", "9" * 400 + "d", "10s5s", 10, 1.5, None, True]
REFUSED_TEXT = [value for value in REFUSED if isinstance(value, str)]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "seconds"), ACCEPTED)
def test_accepted(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("value", REFUSED)
def test_refused(value: Any) -> None:
    with pytest.raises(DurationError, match="is not a duration"):
        parse_duration(value)


def test_whole_refuses_a_fraction() -> None:
    assert parse_duration("90m", whole=True) == 5400.0
    with pytest.raises(DurationError, match="whole numbers"):
        parse_duration("1.5h", whole=True)


@pytest.mark.parametrize("text", ["100ms", "250ms", "10s", "5m", "24h", "30d", "90s", "36h"])
def test_format_round_trips(text: str) -> None:
    assert format_duration(parse_duration(text)) == text


# ------------------------------------------------------------------ each caller's own error


@pytest.mark.parametrize("value", REFUSED)
def test_the_config_answers_with_a_config_error(value: Any) -> None:
    with pytest.raises(ConfigError, match="is not a duration"):
        config_duration(value)


@pytest.mark.parametrize("text", REFUSED_TEXT)
def test_gate_since_answers_with_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="neither a duration ago"):
        parse_when(text, NOW)


def test_gate_since_reads_a_duration_ago_or_an_iso_time() -> None:
    assert parse_when("72h", NOW) == NOW - timedelta(hours=72)
    assert parse_when("90m", NOW) == NOW - timedelta(minutes=90)
    assert parse_when("2026-11-30T00:00:00", NOW) == datetime(2026, 11, 30, tzinfo=UTC)


def test_gate_since_before_the_year_1_is_a_usage_error_not_a_crash() -> None:
    with pytest.raises(UsageError, match="before the year 1"):
        parse_when("99999999d", NOW)


def test_gate_window_counts_since_back_from_until_and_defaults_to_the_rfcs() -> None:
    assert window_of("phase0", None, None, NOW) == Window(NOW - timedelta(hours=72), NOW)
    assert window_of("phase1", None, "1d", NOW) == Window(NOW - timedelta(days=8), NOW - timedelta(days=1))
    assert window_of("phase3", "14d", "2026-11-30T00:00", NOW) == Window(
        datetime(2026, 11, 16, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC))
    assert window_of("phase2", "2026-11-01T00:00+01:00", None, NOW).since == datetime(2026, 10, 31, 23, tzinfo=UTC)
    with pytest.raises(UsageError, match="the window is empty"):
        window_of("phase0", "2026-11-30T00:00", "2026-11-29T00:00", NOW)


def _window(query: str) -> int:
    return params.stats_window(falcon.testing.create_req(query_string=query))


@pytest.mark.parametrize("text", [*REFUSED_TEXT, "1.5h", "59m", "8d", "3600500ms"])
def test_the_api_window_answers_with_a_400(text: str) -> None:
    with pytest.raises(Problem) as refused:
        _window(falcon.to_query_str({"window": text}, prefix=False))
    assert refused.value.status_code == 400 and refused.value.kind == "bad-request"


@pytest.mark.parametrize(("text", "seconds"), [("1h", 3600), ("100m", 6000), ("7d", 604800), ("3600s", 3600)])
def test_the_api_window_reads_the_same_syntax(text: str, seconds: int) -> None:
    assert _window(f"window={text}") == seconds
