"""The log formatter escapes control characters: no logged text forges a line.

A request path such as ``/v2/x%0A2026-01-01 00:00:00,000 ERROR ...`` reaches the
log decoded; so can any text a client or a receiver controls (a message's
arguments, an exception's text).  Every record starts at the beginning of a
line with its timestamp, and nothing else does.
"""

from __future__ import annotations

import logging
import re

import pytest

from tests.support.logfile import LogFile

FORGED = "2026-01-01 00:00:00,000 ERROR [api] dispatcher.api forged"
RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def test_a_decoded_path_in_a_message_stays_on_its_line(log_file: LogFile) -> None:
    logging.getLogger("dispatcher.api").warning("GET %s: 503", f"/v2/x\n{FORGED}\r\x1b[2J\x85\u2028")
    lines = log_file.lines()
    assert len(lines) == 1
    assert "\\n" + FORGED + "\\r\\x1b[2J\\x85\\u2028" in lines[0]


def test_a_message_text_itself_is_escaped(log_file: LogFile) -> None:
    logging.getLogger("dispatcher").error("refused\n" + FORGED)
    assert log_file.lines() == [log_file.lines()[0]]
    assert log_file.lines()[0].endswith("refused\\n" + FORGED)


def test_an_exception_text_cannot_start_a_record(log_file: LogFile) -> None:
    try:
        raise ValueError("bad path /v2/x\n" + FORGED)
    except ValueError:
        logging.getLogger("dispatcher.api").exception("unhandled error in GET %s", "/v2/\nx")
    lines = log_file.lines()
    starts = [line for line in lines if RECORD_START.match(line)]
    assert len(starts) == 1 and "unhandled error in GET /v2/\\nx" in starts[0]
    assert any("Traceback" in line for line in lines[1:])  # the traceback keeps its lines, indented
    assert any(line.strip() == FORGED for line in lines[1:])


def test_the_cli_stderr_log_escapes_too(capsys: pytest.CaptureFixture[str]) -> None:
    from dispatcher.runtime.logsetup import quiet_libraries

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = []
    try:
        quiet_libraries(verbose=False)
        logging.getLogger("dispatcher.cli").warning("endpoint %s", "x\n" + FORGED)
        for handler in root.handlers:
            handler.flush()
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith("endpoint x\\n" + FORGED)
