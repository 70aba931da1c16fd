"""Tracing without a database: the settings and their OTEL_* overrides, the optional import, the spans' plumbing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dispatcher.config import ConfigError, TracingConfig, config_from_mapping
from dispatcher.tracing import NO_SPAN, Tracer, carrier_of, current_context, is_sampled, keyed_trace, trace_id_of

REPO = Path(__file__).resolve().parents[2]


def tracing(raw: dict[str, object], env: dict[str, str] | None = None) -> TracingConfig:
    return config_from_mapping({"tracing": raw}, env=env or {}).tracing


class TestSettings:
    def test_defaults_are_off(self) -> None:
        assert tracing({}) == TracingConfig(enabled=False, exporter="otlp",
                                            endpoint="http://127.0.0.1:4318/v1/traces", sample_ratio=1.0)

    def test_bad_values_are_named(self) -> None:
        with pytest.raises(ConfigError, match="tracing.sample_ratio"):
            tracing({"sample_ratio": 1.5})
        with pytest.raises(ConfigError, match="tracing.exporter"):
            tracing({"exporter": "zipkin"})

    def test_the_environment_wins(self) -> None:
        env = {"OTEL_TRACES_SAMPLER_ARG": "0.25", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
               "OTEL_TRACES_EXPORTER": "console"}
        got = tracing({"enabled": True, "sample_ratio": 1, "endpoint": "http://a/v1/traces"}, env)
        assert (got.enabled, got.sample_ratio, got.endpoint, got.exporter) == (
            True, 0.25, "http://collector:4318/v1/traces", "console")
        got = tracing({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x",
                           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://base"})
        assert got.endpoint == "http://t/x"

    def test_sdk_disabled_turns_tracing_off_never_on(self) -> None:
        assert not tracing({"enabled": True}, {"OTEL_SDK_DISABLED": "true"}).enabled
        assert not tracing({}, {"OTEL_SDK_DISABLED": "false"}).enabled

    def test_a_bad_variable_is_named(self) -> None:
        with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER_ARG"):
            tracing({}, {"OTEL_TRACES_SAMPLER_ARG": "lots"})
        with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER"):
            tracing({}, {"OTEL_TRACES_EXPORTER": "jaeger"})


def test_sampled_flag_and_trace_id() -> None:
    sampled = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    assert is_sampled(sampled) and trace_id_of(sampled) == "a" * 32
    assert trace_id_of(sampled[:-2] + "00") is None and trace_id_of(None) is None and not is_sampled("junk")


def test_a_tracer_that_is_off_does_nothing() -> None:
    tracer = Tracer.from_config(TracingConfig(enabled=False), "test")
    assert not tracer.enabled
    with tracer.span("x", parent={"traceparent": "bad"}, links=[None, {}]) as span:
        assert span is NO_SPAN and span.headers() == {} and span.traceparent is None


def test_bad_carriers_are_skipped_not_raised() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracer = Tracer.from_config(TracingConfig(enabled=True), "test", exporter=exporter)
    with tracer.span("x", parent={"traceparent": "00-zz"}, links=[{"traceparent": "nonsense"}, None]) as span:
        span.set({"a": 1, "b": None})
        assert span.traceparent is not None and span.headers()["traceparent"] == span.traceparent
    tracer.flush()
    (finished,) = exporter.get_finished_spans()
    assert finished.parent is None and list(finished.links) == [] and dict(finished.attributes or {}) == {"a": 1}
    tracer.shutdown()


_NO_IMPORT = textwrap.dedent("""
    import sys
    from dispatcher.config import config_from_mapping
    from dispatcher.producer import WebhookSender
    from dispatcher.tracing import Tracer, current_context
    config = config_from_mapping({}, env={})
    tracer = Tracer.from_config(config.tracing, "probe")
    with tracer.span("attempt", parent={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}) as span:
        span.set({"x": 1})
    assert current_context() is None
    WebhookSender(config)
    import dispatcher.engine.delivery, dispatcher.api.app  # noqa: E401
    loaded = sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")
    print("loaded:", loaded)
    assert not loaded, loaded
""")


@pytest.mark.parametrize("hide", [False, True], ids=["installed", "missing"])
def test_tracing_off_imports_no_opentelemetry(hide: bool, tmp_path: Path) -> None:
    """Off, nothing of OpenTelemetry is imported -- and with it missing altogether, everything still works."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if hide:  # a package named opentelemetry that fails to import stands for "not installed"
        (tmp_path / "opentelemetry").mkdir()
        (tmp_path / "opentelemetry" / "__init__.py").write_text("raise ImportError('not installed')\n")
        env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{REPO}"
    done = subprocess.run([sys.executable, "-c", _NO_IMPORT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "loaded: []" in done.stdout


def test_enabled_without_the_extra_warns_and_traces_nothing(tmp_path: Path) -> None:
    (tmp_path / "opentelemetry").mkdir()
    (tmp_path / "opentelemetry" / "__init__.py").write_text("raise ImportError('not installed')\n")
    code = textwrap.dedent("""
        from dispatcher.config import TracingConfig
        from dispatcher.tracing import Tracer
        tracer = Tracer.from_config(TracingConfig(enabled=True), "probe")
        assert not tracer.enabled
        print("off")
    """)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "off" in done.stdout, done.stderr
    assert "OpenTelemetry is not installed" in done.stderr


def test_current_context_reads_the_callers_span() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("caller")
    assert current_context() is None
    with tracer.start_as_current_span("request") as span:
        carrier = current_context()
        context = span.get_span_context()
    flags = int(context.trace_flags)
    assert carrier == {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"}
    assert int(carrier["traceparent"][-2:], 16) & 1


def test_sampling_is_decided_before_the_sdk_and_children_follow_their_parent() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    never = Tracer.from_config(TracingConfig(enabled=True, sample_ratio=0.0), "test", exporter=exporter)
    with never.span("root") as root:
        assert root.traceparent is not None and root.traceparent.endswith("-00") and root.trace_id is None
    kept_parent = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "k=v"}
    with never.span("child", parent=kept_parent) as child:
        assert child.trace_id == "a" * 32 and child.headers()["tracestate"] == "k=v"
    always = Tracer.from_config(TracingConfig(enabled=True, sample_ratio=1.0), "test", exporter=exporter)
    with always.span("unkept child", parent={"traceparent": kept_parent["traceparent"][:-2] + "00"}) as quiet:
        assert quiet.traceparent is not None and quiet.traceparent.split("-")[1] == "a" * 32
        assert quiet.traceparent.endswith("-00") and quiet.trace_id is None
    never.flush()
    always.flush()
    assert [s.name for s in exporter.get_finished_spans()] == ["child"]
    assert exporter.get_finished_spans()[0].parent.span_id == int("b" * 16, 16)


PARENT_TRACE, PARENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
UNSAMPLED = f"00-{PARENT_TRACE}-{PARENT_SPAN}-00"
INVALID_PARENTS = [
    "00-zz", "", f"ff-{PARENT_TRACE}-{PARENT_SPAN}-01", f"00-{'0' * 32}-{PARENT_SPAN}-01",
    f"00-{PARENT_TRACE}-{'0' * 16}-01", f"00-{PARENT_TRACE.upper()}-{PARENT_SPAN}-01",
    f"00-{PARENT_TRACE}-{PARENT_SPAN}-01-extra", 42,
]


class TestUnkeptSpans:
    """A span that is not kept (issue 26's cost): strings only, never an OpenTelemetry object."""

    made: list[Tracer]

    @pytest.fixture
    def exporter(self) -> Iterator[Any]:
        pytest.importorskip("opentelemetry.sdk")
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.made = []
        yield InMemorySpanExporter()
        for tracer in self.made:
            tracer.shutdown()

    def tracer(self, exporter: Any, ratio: float) -> Tracer:
        tracer = Tracer.from_config(TracingConfig(enabled=True, sample_ratio=ratio), "test", exporter=exporter)
        self.made.append(tracer)
        return tracer

    def test_a_child_of_an_unsampled_parent_holds_strings_only(self, exporter: Any) -> None:
        tracer = self.tracer(exporter, 1.0)  # the parent's flag decides, not the ratio
        span = tracer.begin("attempt", {"traceparent": UNSAMPLED, "tracestate": "congo=t61rcWkgMzE,rojo=00f0"})
        assert span is not None and not span.recording and span.trace_id is None
        assert all(isinstance(value, str) for value in vars(span).values()), vars(span)
        assert type(span).__module__ == "dispatcher.tracing"
        span.set({"a": 1})
        span.link([{"traceparent": UNSAMPLED}])
        span.failed("no")
        span.end()
        tracer.flush()
        assert exporter.get_finished_spans() == ()

    def test_its_traceparent_inherits_the_trace_and_carries_the_tracestate_unchanged(self, exporter: Any) -> None:
        tracer = self.tracer(exporter, 0.0)
        state = "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"  # as sent, spaces and all
        span = tracer.begin("attempt", {"traceparent": UNSAMPLED, "tracestate": state})
        assert span is not None and span.traceparent is not None
        version, trace_id, span_id, flags = span.traceparent.split("-")
        assert (version, trace_id, flags) == ("00", PARENT_TRACE, "00")
        assert len(span_id) == 16 and span_id != PARENT_SPAN and int(span_id, 16)
        assert span.headers() == {"traceparent": span.traceparent, "tracestate": state}
        other = tracer.begin("attempt", {"traceparent": UNSAMPLED})
        assert other is not None and other.headers() == {"traceparent": other.traceparent}
        assert other.traceparent != span.traceparent

    def test_a_tracestate_that_cannot_be_a_header_is_dropped(self, exporter: Any) -> None:
        span = self.tracer(exporter, 0.0).begin("attempt", {"traceparent": UNSAMPLED, "tracestate": "a=b\r\nX: y"})
        assert span is not None and "tracestate" not in span.headers()

    def test_a_new_unkept_trace_has_fresh_ids(self, exporter: Any) -> None:
        tracer = self.tracer(exporter, 0.0)
        first, second = tracer.begin("attempt"), tracer.begin("attempt")
        assert first is not None and second is not None
        for span in (first, second):
            assert span.traceparent is not None and is_valid_traceparent(span.traceparent)
            assert span.traceparent.endswith("-00") and span.headers() == {"traceparent": span.traceparent}
        assert first.traceparent.split("-")[1] != second.traceparent.split("-")[1]

    @pytest.mark.parametrize("bad", INVALID_PARENTS)
    def test_an_invalid_parent_is_no_parent(self, exporter: Any, bad: object) -> None:
        carrier: Any = {"traceparent": bad, "tracestate": "k=v"}
        unkept = self.tracer(exporter, 0.0).begin("attempt", carrier)
        assert unkept is not None and unkept.traceparent is not None and is_valid_traceparent(unkept.traceparent)
        assert unkept.traceparent.split("-")[1] != PARENT_TRACE and unkept.headers().keys() == {"traceparent"}
        kept_tracer = self.tracer(exporter, 1.0)
        kept = kept_tracer.begin("attempt", carrier)
        assert kept is not None and kept.recording
        kept.end()
        kept_tracer.flush()
        (finished,) = exporter.get_finished_spans()
        assert finished.parent is None

    @pytest.mark.parametrize("flags", ["01", "03"])
    def test_a_sampled_parent_makes_a_kept_child(self, exporter: Any, flags: str) -> None:
        tracer = self.tracer(exporter, 0.0)  # the parent's flag decides, not the ratio
        span = tracer.begin("attempt", {"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-{flags}"})
        assert span is not None and span.recording and span.trace_id == PARENT_TRACE
        assert span.traceparent is not None and span.traceparent.endswith("-01")
        span.end()
        tracer.flush()
        (finished,) = exporter.get_finished_spans()
        assert f"{finished.parent.span_id:016x}" == PARENT_SPAN

    def test_an_unkept_api_request_span_is_current_while_the_resource_runs(self, exporter: Any) -> None:
        """A replay takes the request span's context (current_context) even when it is not kept."""
        from dispatcher.tracing import TracingMiddleware

        middleware = TracingMiddleware(self.tracer(exporter, 0.0))
        headers = {"traceparent": UNSAMPLED, "tracestate": "k=v"}
        req = SimpleNamespace(method="POST", path="/x", uri_template="/x", context=SimpleNamespace(),
                              get_header=headers.get)
        middleware.process_request(req, None)
        carrier = current_context()
        assert carrier is not None and carrier["traceparent"].split("-")[1] == PARENT_TRACE
        assert carrier["traceparent"].endswith("-00") and carrier["tracestate"] == "k=v"
        middleware.process_resource(req, None, None, {})
        middleware.process_response(req, SimpleNamespace(status_code=202), None, True)
        assert current_context() is None
        assert exporter.get_finished_spans() == ()


def is_valid_traceparent(value: str) -> bool:
    version, trace_id, span_id, flags = value.split("-")
    return (version == "00" and len(trace_id) == 32 and len(span_id) == 16 and len(flags) == 2
            and int(trace_id, 16) > 0 and int(span_id, 16) > 0)


@pytest.mark.parametrize(("text", "carrier"), [
    (None, None), ("", None), ("{not json", None), ("[1, 2]", None), ('"00-abc"', None), ("null", None),
    ('{"traceparent": "x", "replayed_from": "y"}', {"traceparent": "x", "replayed_from": "y"}),
])
def test_a_stored_carrier_is_parsed_without_raising(text: str | None, carrier: dict[str, str] | None) -> None:
    assert carrier_of(text) == carrier


class _Recorder:
    """A transport that answers 200 and keeps the headers of each POST."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    def post(self, url: str, headers: dict[str, str], body: bytes, workspace: str | None = None) -> Any:
        from dispatcher.rules.attempt import TransportResult

        self.headers.append(dict(headers))
        return TransportResult(status=200, body=b"", error=None, detail="", retry_after=None, duration=0.01)

    def close(self) -> None:
        pass


PRODUCER = f"00-{'c' * 32}-{'d' * 16}-01"


def claimed_row(row_id: int, event_id: str, attempt: int, delivery_trace: str | None) -> Any:
    """A claimed row of an event produced inside a sampled span (PRODUCER), to a live endpoint."""
    from dispatcher.store.engine import ClaimedRow

    return ClaimedRow(id=row_id, claim_token=1, grants_slot=True, endpoint_id=1, event_id=event_id, attempt=attempt,
                      mode="live", age=1.0, db_now=1.8e9, is_probe=False, event_type="job.done", sequence=1,
                      occurred_at="", payload="{}", url="https://hooks.example.test/in", active=True,
                      secret="s3cret", previous_secret=None, workspace_id="acme",
                      event_trace=json.dumps({"traceparent": PRODUCER}), delivery_trace=delivery_trace)


class TestClaimedTraceText:
    """The claim hands trace contexts over as JSON text; only a span that needs one parses it."""

    def attempt(self, monkeypatch: pytest.MonkeyPatch, tracer: Tracer, delivery: str | None) -> tuple[
            list[str | None], dict[str, str]]:
        from dispatcher.engine import delivery as module
        from dispatcher.rules.retry import RetryPolicies, RetryPolicy

        parsed: list[str | None] = []

        def counting(text: str | None) -> dict[str, str] | None:
            parsed.append(text)
            return carrier_of(text)

        monkeypatch.setattr(module, "carrier_of", counting)
        row = claimed_row(1, "evt_1", attempt=2, delivery_trace=delivery)
        transport = _Recorder()
        done = module.DeliveryMaker(transport, RetryPolicies(RetryPolicy()), tracer=tracer).attempt(row, 0.0)
        assert done.record.status == "delivered"
        (headers,) = transport.headers
        return parsed, headers

    def test_untraced_nothing_is_parsed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        parsed, headers = self.attempt(monkeypatch, Tracer.off(), json.dumps({"traceparent": UNSAMPLED}))
        assert parsed == [] and "traceparent" not in headers

    def test_an_unkept_attempt_parses_its_delivery_trace_only(self, monkeypatch: pytest.MonkeyPatch) -> None:
        pytest.importorskip("opentelemetry.sdk")
        tracer = Tracer.from_config(TracingConfig(enabled=True, exporter="none"), "test")
        delivery = json.dumps({"traceparent": UNSAMPLED})
        parsed, headers = self.attempt(monkeypatch, tracer, delivery)
        assert parsed == [delivery]  # not the producer's: an unkept span makes no links
        assert headers["traceparent"].split("-")[1] == PARENT_TRACE and headers["traceparent"].endswith("-00")
        tracer.shutdown()

    def test_a_kept_attempt_links_to_the_producer_from_the_text(self, monkeypatch: pytest.MonkeyPatch) -> None:
        pytest.importorskip("opentelemetry.sdk")
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        tracer = Tracer.from_config(TracingConfig(enabled=True), "test", exporter=exporter)
        sampled = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
        parsed, headers = self.attempt(monkeypatch, tracer, json.dumps({"traceparent": sampled}))
        assert len(parsed) == 2 and headers["traceparent"].split("-")[1] == PARENT_TRACE
        tracer.flush()
        (span,) = exporter.get_finished_spans()
        assert [(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in span.links] == [
            ("c" * 32, "d" * 16)]
        tracer.shutdown()

    def test_a_malformed_delivery_trace_is_no_parent(self, monkeypatch: pytest.MonkeyPatch) -> None:
        pytest.importorskip("opentelemetry.sdk")
        tracer = Tracer.from_config(TracingConfig(enabled=True, exporter="none", sample_ratio=0.0), "test")
        _, headers = self.attempt(monkeypatch, tracer, "{broken")
        assert headers["traceparent"].split("-")[1] != PARENT_TRACE
        tracer.shutdown()


KEYS = [f"evt_{n:05d}/{n * 7919}".encode() for n in range(400)]


@pytest.mark.parametrize("ratio", [0.0, 0.01, 0.25, 0.5, 1.0])
def test_a_keyed_trace_is_decided_as_the_sdks_trace_id_ratio_sampler_decides(ratio: float) -> None:
    # keyed_trace's rule is OpenTelemetry's TraceIdRatioBased on the derived id: the same cases, both sides.
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

    sdk = TraceIdRatioBased(ratio)
    for key in KEYS:
        trace_id, keep = keyed_trace(key, ratio)
        assert 0 < trace_id < 1 << 128 and keyed_trace(key, ratio) == (trace_id, keep)
        decided = sdk.should_sample(None, trace_id, "attempt").decision is Decision.RECORD_AND_SAMPLE
        assert keep == decided, (key, ratio)
    assert len({keyed_trace(key, ratio)[0] for key in KEYS}) == len(KEYS)


class TestKeyedRoots:
    """A delivery's attempts without a stored parent (issue 26's cost): the decision and the trace id
    come from the row, so the row stores a context only once a trace is kept."""

    def attempts(self, ratio: float, times: int = 2) -> tuple[list[Any], list[dict[str, str]]]:
        pytest.importorskip("opentelemetry.sdk")
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from dispatcher.engine.delivery import DeliveryMaker
        from dispatcher.rules.retry import RetryPolicies, RetryPolicy

        tracer = Tracer.from_config(TracingConfig(enabled=True, sample_ratio=ratio), "test",
                                    exporter=InMemorySpanExporter())
        row = claimed_row(41, "evt_keyed", attempt=1, delivery_trace=None)
        transport = _Recorder()
        maker = DeliveryMaker(transport, RetryPolicies(RetryPolicy()), tracer=tracer)
        records = [maker.attempt(row, 0.0).record for _ in range(times)]
        tracer.shutdown()
        return records, transport.headers

    def test_attempts_not_kept_store_nothing_and_carry_one_trace_id(self) -> None:
        records, headers = self.attempts(0.0)
        expected = f"{keyed_trace(b'evt_keyed/41', 0.0)[0]:032x}"
        assert [h["traceparent"].split("-")[1] for h in headers] == [expected, expected]
        assert all(h["traceparent"].endswith("-00") for h in headers)
        assert [r.trace_root for r in records] == [False, False], "an unkept root is not written back"
        assert len({h["traceparent"] for h in headers}) == 2, "each attempt is a span of its own"

    def test_a_kept_root_is_written_back_for_its_children(self) -> None:
        records, headers = self.attempts(1.0, times=1)
        (record,) = records
        assert record.trace_root and record.traceparent == headers[0]["traceparent"]
        assert is_sampled(record.traceparent) and record.trace_id == record.traceparent[3:35]
