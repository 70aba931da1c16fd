"""Logging set-up shared by the supervisor, workers and the API process.

Attempt lines are key=value text, one per attempt, cheap to format.  A log
file that cannot be opened falls back to stderr rather than stopping delivery.

Cost per line matters: a worker writes one attempt line per delivery, thousands
a second.  So (docs/benchmarks.md has the profile):

* attempt lines (logger ``dispatcher.attempt``) are buffered and written in
  batches of whole lines, at most ``FLUSH_INTERVAL`` late and at exit: one
  ``write`` per batch instead of one per line (O_APPEND keeps the lines of the
  supervisor and its workers, which share the file, from tearing).  Any other
  line is written at once, together with the attempt lines before it, so
  lifecycle and warning lines appear exactly when they did, in order;
* the timestamp's date-time part is formatted once per second, not per line;
* the caller's file/line lookup (``logging._srcfile``) is off: no format uses it;
* an attempt line skips the logging machinery when nothing but this handler would
  see its record (``dispatcher.linelog``, :meth:`BufferedLineHandler.emit_info`):
  the same text, put in the buffer directly.
  A ``LogRecord``, its handler lookup and its formatting cost about 6 us a line,
  this about 3; a worker writes one per delivery (docs/benchmarks.md, "The attempt line").

Every record is one line that starts with its timestamp, and no other line
does: control characters in a record's text (a decoded request path, a
receiver's error text) are escaped, and a traceback's lines are indented.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dispatcher.config import LoggingConfig

FLUSH_INTERVAL = 0.2      # seconds a buffered line may wait
FLUSH_BYTES = 64 * 1024   # or this many bytes, whichever comes first
BATCHED_LOGGERS = frozenset({"dispatcher.attempt"})


def _interpreter_rlock() -> threading.RLock:
    """The interpreter's own RLock, also in a gevent-patched worker, where threading's is a
    pure-Python one (taken and released per line).  Nothing done under a handler's lock
    yields to another greenlet (formatting, and os.write, which gevent leaves blocking), so
    no greenlet ever waits for it.  gevent is not imported here: producers' processes
    load this module too and stay unpatched."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None:
        return threading.RLock()
    rlock: Callable[[], threading.RLock] = monkey.get_original("_thread", "RLock")
    return rlock()


class BufferedLineHandler(logging.Handler):
    """Formats into a buffer of whole lines, written to ``fd`` in one call per flush."""

    def createLock(self) -> None:  # noqa: N802 (logging's name)
        self.lock = _interpreter_rlock()

    def __init__(self, fd: int, owns_fd: bool) -> None:
        super().__init__()
        self._fd = fd
        self._owns_fd = owns_fd
        self._lines: list[str] = []
        self._size = 0
        self._oldest = 0.0
        self._closed = False
        flusher = threading.Thread(target=self._flush_periodically, name="log-flush", daemon=True)
        flusher.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        self._buffer(line, record.name in BATCHED_LOGGERS and record.levelno < logging.WARNING)

    def emit_info(self, name: str, message: str) -> bool:
        """An INFO line of logger ``name``, as :meth:`emit` would write its record
        (``dispatcher.linelog.LineLog``); False: its format needs a record, nothing was written."""
        formatter = self.formatter
        if not isinstance(formatter, _Formatter) or not formatter.fills_info_lines:
            return False
        line = formatter.info_line(name, message, time.time()) + "\n"
        with self.lock:  # type: ignore[union-attr]  # createLock made it
            self._buffer(line, name in BATCHED_LOGGERS)
        return True

    def _buffer(self, line: str, batched: bool) -> None:
        """Add ``line``; write the buffer now unless the line may wait; the caller holds the lock."""
        if not self._lines:
            self._oldest = time.monotonic()
        self._lines.append(line)
        self._size += len(line)
        if not batched or self._size >= FLUSH_BYTES:
            self._write()

    def _write(self) -> None:
        """Write what is buffered; the caller holds the handler lock."""
        if not self._lines or self._closed:
            return
        data = "".join(self._lines).encode("utf-8", "replace")
        self._lines.clear()
        self._size = 0
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            pass  # a full disk or a closed stderr must not stop delivery; the lines are dropped

    def flush(self) -> None:
        self.acquire()
        try:
            self._write()
        finally:
            self.release()

    def _flush_periodically(self) -> None:
        while not self._closed:
            time.sleep(FLUSH_INTERVAL / 2)
            if self._lines and time.monotonic() - self._oldest >= FLUSH_INTERVAL:
                self.flush()

    def close(self) -> None:
        self.acquire()
        try:
            self._write()
            self._closed = True
            if self._owns_fd:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
        finally:
            self.release()
        super().close()


# C0, DEL, C1 and the Unicode line and paragraph separators: whatever a terminal or
# str.splitlines takes for a line break or a control sequence.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(char: re.Match[str]) -> str:
    code = ord(char.group())
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char.group())
    return named or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as its escape (``\\n``, ``\\x1b``)."""
    if text.isprintable():  # in C, and true of nearly every line: none of _CONTROL is printable
        return text
    return _CONTROL.sub(_escaped, text) if _CONTROL.search(text) else text


def _indented(block: str) -> str:
    """A traceback's lines, each escaped and indented: none can pass for a record of its own."""
    return "\n".join("    " + escape_controls(line) for line in block.split("\n"))


_FIELD = re.compile(r"%\((\w+)\)")  # a %-style format's field names


class _Formatter(logging.Formatter):
    """The stock ``%(asctime)s`` text, with the date-time part formatted once per second,
    and control characters escaped (see the module docstring)."""

    _second = -1
    _prefix = ""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        # info_line fills these fields itself; a format naming any other takes the record's path.
        self.fills_info_lines = set(_FIELD.findall(fmt)) <= {"asctime", "levelname", "name", "message"}

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self._stamp(record.created, int(record.msecs))

    def _stamp(self, created: float, msecs: int) -> str:
        second = int(created)
        if second != self._second:
            self._prefix = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        return f"{self._prefix},{msecs:03d}"

    def info_line(self, name: str, message: str, created: float) -> str:
        """The text ``format`` gives an INFO record of ``name`` with ``message`` (no arguments,
        no exception) made at ``created``; only for a format that ``fills_info_lines``."""
        # The record's own msecs rule (logging.LogRecord, Python 3.11): the fraction, truncated.
        stamp = self._stamp(created, int((created - int(created)) * 1000))
        # Escaped whole, as formatMessage escapes the record's formatted text.
        return escape_controls(self._fmt % {"asctime": stamp, "levelname": "INFO",  # type: ignore[operator]
                                            "name": name, "message": message})

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return _indented(super().formatStack(stack_info))


def _open_handler(path: str) -> logging.Handler:
    if path == "-":
        return BufferedLineHandler(sys.stderr.fileno(), owns_fd=False)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        print(f"dispatcher: cannot open log file {path}: {exc}; logging to stderr", file=sys.stderr)
        return BufferedLineHandler(sys.stderr.fileno(), owns_fd=False)
    return BufferedLineHandler(fd, owns_fd=True)


def library_level(level: int | str, verbose: bool) -> int:
    """The level of every logger but ``dispatcher.*``: other libraries (pgserver,
    urllib3, ...) speak at WARNING and above unless ``-v`` asks for more, so the
    first screen shows the product and not a library's start-up chatter."""
    number = logging.getLevelName(level) if isinstance(level, str) else level
    return int(number) if verbose else max(int(number), logging.WARNING)


def quiet_libraries(verbose: bool, level: int = logging.INFO) -> None:
    """The CLI's stderr logging: ``dispatcher.*`` at ``level``, the rest at :func:`library_level`."""
    logging.basicConfig(level=library_level(level, verbose))
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.getLogger("dispatcher").setLevel(level)


def configure_logging(config: LoggingConfig, process_name: str = "dispatcher", verbose: bool = False) -> None:
    handler = _open_handler(config.file)
    # The process name is fixed per process, so it goes into the format once
    # instead of being looked up on every record.
    safe_name = process_name.replace("%", "%%")
    handler.setFormatter(_Formatter(f"%(asctime)s %(levelname)s [{safe_name}] %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(library_level(config.level, verbose))
    logging.getLogger("dispatcher").setLevel(config.level)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # no caller lookup per record: no format here uses file or line
