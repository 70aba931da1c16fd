"""`gate phase0 --producer-timings FILE`: the two export forms read into bucket series
(dispatcher/cli/timings.py), and every unusable file refused with its reason."""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatcher.cli.timings import TimingsError, parse_exposition, parse_prometheus_json, read_timings
from dispatcher.rules import gates

T0 = datetime(2026, 9, 22, tzinfo=UTC)
BUCKET = "webhook_producer_outbox_write_seconds_bucket"


def response(result: list[dict[str, Any]], kind: str = "matrix") -> str:
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}})


def series(le: str, values: list[tuple[float, str]], **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": BUCKET, "le": le, **labels}, "values": [[t, v] for t, v in values]}


class TestPrometheusJson:
    def test_a_matrix_of_buckets(self) -> None:
        start = T0.timestamp()
        text = response([series("0.002", [(start, "10"), (start + 60, "40")], instance="a"),
                         series("+Inf", [(start, "10"), (start + 60, "41")], instance="a"),
                         series("0.002", [(start + 30, "5")], instance="b")])
        found = parse_prometheus_json(text)
        assert [(s.le, s.points) for s in found] == [
            (0.002, ((T0, 10.0), (T0 + timedelta(seconds=60), 40.0))),
            (math.inf, ((T0, 10.0), (T0 + timedelta(seconds=60), 41.0))),
            (0.002, ((T0 + timedelta(seconds=30), 5.0),))]
        assert gates.histogram(found).buckets == ((0.002, 30.0), (math.inf, 31.0))

    def test_an_aggregated_series_has_no_name_and_other_series_are_left_out(self) -> None:
        text = response([{"metric": {"le": "0.001"}, "values": [[1.0, "1"]]},
                         {"metric": {"__name__": "webhook_delivery_latency_seconds_bucket", "le": "0.005"},
                          "values": [[1.0, "9"]]},
                         {"metric": {"__name__": BUCKET}, "values": [[1.0, "9"]]}])
        assert [s.le for s in parse_prometheus_json(text)] == [0.001]

    def test_an_instant_vector_is_one_point_per_series(self) -> None:
        text = response([{"metric": {"le": "+Inf"}, "value": [T0.timestamp(), "100"]}], kind="vector")
        (found,) = parse_prometheus_json(text)
        assert found.points == ((T0, 100.0),)

    @pytest.mark.parametrize(("text", "words"), [
        ("[1, 2", "not JSON"),
        ('{"status": "error", "errorType": "timeout", "error": "query timed out"}',
         "not a successful Prometheus API response: query timed out"),
        ('{"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}', "a scalar result"),
        ('{"status": "success", "data": {"resultType": "matrix"}}', "a matrix result"),
        (response([]), "no webhook_producer_outbox_write_seconds_bucket series"),
        (response([series("0.002", [(1.0, "NaN")])]), "count is NaN"),
        (response([series("fast", [(1.0, "1")])]), "bucket bound le is not a number: 'fast'"),
        (response([series("-1", [(1.0, "1")])]), "is negative"),
        (response([{"metric": {"le": "1"}, "values": [[1.0]]}]), "malformed samples"),
        (response([series("1", [(1e300, "1")])]), "out of range"),
    ])
    def test_unusable_responses_are_refused_with_their_reason(self, text: str, words: str) -> None:
        with pytest.raises(TimingsError, match=words.replace("(", r"\(")):
            parse_prometheus_json(text)


DUMP = f"""# HELP webhook_producer_outbox_write_seconds outbox write
# TYPE webhook_producer_outbox_write_seconds histogram
{BUCKET}{{region="eu-west-1",le="0.001"}} 900
{BUCKET}{{le="0.002",region="eu-west-1"}} 995
{BUCKET}{{region="eu-west-1",le="+Inf"}} 1000
webhook_producer_outbox_write_seconds_sum{{region="eu-west-1"}} 0.9
webhook_producer_outbox_write_seconds_count{{region="eu-west-1"}} 1000
# TYPE process_start_time_seconds gauge
process_start_time_seconds {T0.timestamp():.2f}
"""


class TestExposition:
    def test_counts_run_from_the_exporters_start_to_the_dump(self) -> None:
        taken = T0 + timedelta(hours=80)
        found = parse_exposition(DUMP, taken)
        assert [(s.le, s.points) for s in found] == [
            (0.001, ((T0, 0.0), (taken, 900.0))), (0.002, ((T0, 0.0), (taken, 995.0))),
            (math.inf, ((T0, 0.0), (taken, 1000.0)))]
        histogram = gates.histogram(found)
        assert (histogram.start, histogram.end, histogram.lost) == (T0, taken, ())

    def test_a_samples_own_timestamp_wins(self) -> None:
        stamped = DUMP.replace('le="+Inf"} 1000', f'le="+Inf"}} 1000 {int((T0.timestamp() + 3600) * 1000)}')
        found = parse_exposition(stamped, T0 + timedelta(hours=80))
        assert found[-1].points[-1] == (T0 + timedelta(hours=1), 1000.0)

    def test_escaped_label_values(self) -> None:
        text = f'{BUCKET}{{note="a \\"quoted\\", comma",le="+Inf"}} 3\nprocess_start_time_seconds 1\n'
        assert [s.le for s in parse_exposition(text, T0)] == [math.inf]

    @pytest.mark.parametrize(("text", "words"), [
        ('webhook_producer_outbox_write_seconds{quantile="0.99"} 0.001\n', "is a summary here"),
        ("process_start_time_seconds 1\n", "no webhook_producer_outbox_write_seconds_bucket samples"),
        (f'{BUCKET}{{le="+Inf"}} 3\n', "no process_start_time_seconds"),
        (f'{BUCKET}{{region="x"}} 3\nprocess_start_time_seconds 1\n', "a bucket without an le label"),
        (f"{BUCKET}{{le=+Inf}} 3\n", "cannot read the labels"),
        ("this is not the text format\n", "line 1 is not a sample"),
    ])
    def test_unusable_dumps_are_refused_with_their_reason(self, text: str, words: str) -> None:
        with pytest.raises(TimingsError, match=words):
            parse_exposition(text, T0)


class TestReadTimings:
    def test_the_form_is_told_by_the_content_and_a_dump_is_dated_by_its_file(self, tmp_path: Path) -> None:
        dump = tmp_path / "metrics.txt"
        dump.write_text(DUMP)
        modified = T0 + timedelta(hours=80)
        os.utime(dump, (modified.timestamp(), modified.timestamp()))
        assert read_timings(dump)[0].points[-1] == (modified, 900.0)
        answer = tmp_path / "answer.json"
        answer.write_text("\n  " + response([series("+Inf", [(T0.timestamp(), "1")])]))
        assert read_timings(answer)[0].points == ((T0, 1.0),)

    def test_a_missing_or_binary_file_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(TimingsError, match="cannot read it: No such file or directory"):
            read_timings(tmp_path / "absent")
        binary = tmp_path / "binary"
        binary.write_bytes(b"\xff\xfe\x00")
        with pytest.raises(TimingsError, match="cannot read it"):
            read_timings(binary)
