"""The API's trace ids (migration 0022's dispatcher_sampled_trace_id) and tracing.trace_id_of, on one case table."""

from __future__ import annotations

import pytest

from dispatcher.tracing import trace_id_of

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CASES = [
    (f"00-{TRACE}-00f067aa0ba902b7-01", TRACE),       # sampled
    (f"00-{TRACE}-00f067aa0ba902b7-03", TRACE),       # sampled, with the "random" flag of level 2
    (f"00-{TRACE}-00f067aa0ba902b7-00", None),        # not sampled: stored nowhere, shown nowhere
    (f"00-{TRACE}-00f067aa0ba902b7-02", None),
    ("00-short-00f067aa0ba902b7-01", None),
    (f"00-{TRACE}-00f067aa0ba902b7-zz", None),
    (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None),  # W3C: lower-case hex only
    ("", None),
    (None, None),
]


@pytest.mark.parametrize(("traceparent", "shown"), CASES)
def test_sql_and_python_show_the_same_trace_id(db, traceparent: str | None, shown: str | None) -> None:
    assert trace_id_of(traceparent) == shown
    assert db.query("SELECT dispatcher_sampled_trace_id(%s)", (traceparent,)) == [(shown,)]
