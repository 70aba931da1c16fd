"""``LineLog``: an attempt line written straight into the buffer is the line ``Logger.info``
would have written, and any other listener still gets a record."""

from __future__ import annotations

import logging
import sys

import pytest

from dispatcher.linelog import LineLog
from dispatcher.runtime.logsetup import _CONTROL, _Formatter, escape_controls
from tests.support.logfile import LogFile

STAMP = len("2026-01-01 00:00:00,000")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("message", ["attempt event_id=e1 endpoint_id=3 attempt=1 status=delivered",
                                     "attempt event_id=e\n2026-01-01 00:00:00,000 ERROR forged\x1b[2J\u2028 x=%s"])
def test_a_line_is_the_text_logger_info_writes(log_file: LogFile, message: str) -> None:
    logging.getLogger("dispatcher.attempt").info(message)
    LineLog("dispatcher.attempt").info(message)
    slow, fast = log_file.lines()
    assert fast[STAMP:] == slow[STAMP:]
    assert "\n" not in fast and ("forged" not in message or "\\n2026-01-01" in fast)


def test_its_timestamp_is_the_records(log_file: LogFile) -> None:
    handler = logging.getLogger().handlers[0]
    formatter = handler.formatter
    record = logging.LogRecord("dispatcher.attempt", logging.INFO, __file__, 1, "m", None, None)
    assert formatter is not None
    assert formatter.info_line("dispatcher.attempt", "m", record.created) == formatter.format(record)  # type: ignore[attr-defined]


def test_another_listener_gets_a_record(log_file: LogFile) -> None:
    for where in (logging.getLogger(), logging.getLogger("dispatcher")):
        seen = _Collect()
        where.addHandler(seen)
        try:
            LineLog("dispatcher.attempt").info("attempt event_id=e2")
        finally:
            where.removeHandler(seen)
        assert [r.getMessage() for r in seen.records] == ["attempt event_id=e2"]
    # The file got both lines too, through the record's path.
    assert [line.split(" dispatcher.attempt ")[1] for line in log_file.lines()] == ["attempt event_id=e2"] * 2


def test_a_filter_still_filters(log_file: LogFile) -> None:
    logger = logging.getLogger("dispatcher.attempt")
    dropping = logging.Filter("nothing.matches")
    logger.addFilter(dropping)
    try:
        LineLog("dispatcher.attempt").info("attempt event_id=e3")
    finally:
        logger.removeFilter(dropping)
    assert log_file.lines() == []


def test_the_level_still_holds(log_file: LogFile) -> None:
    logging.getLogger("dispatcher").setLevel(logging.WARNING)
    LineLog("dispatcher.attempt").info("attempt event_id=e4")
    assert log_file.lines() == []


def test_no_character_escaped_is_printable() -> None:
    # escape_controls returns a printable text as it is, unsearched.
    assert [hex(c) for c in range(sys.maxunicode + 1) if _CONTROL.match(chr(c)) and chr(c).isprintable()] == []
    assert escape_controls("a\u2028b\x85c\x1b\u200bd") == "a\\u2028b\\x85c\\x1b\u200bd"


def test_a_format_it_cannot_fill_takes_the_record(log_file: LogFile) -> None:
    handler = logging.getLogger().handlers[0]
    handler.setFormatter(_Formatter("%(levelno)d %(name)s %(message)s"))
    LineLog("dispatcher.attempt").info("attempt event_id=e5")
    assert log_file.lines() == ["20 dispatcher.attempt attempt event_id=e5"]
