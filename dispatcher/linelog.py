"""INFO lines of one logger, at a fraction of ``Logger.info``'s cost (docs/benchmarks.md, "The attempt line").

A worker writes one attempt line per delivery.  When the only thing that would
see its record is a handler that can write the line itself (``emit_info``: the
worker's ``runtime.logsetup.BufferedLineHandler``), with no filter and no other
handler on the way (a test's capture, say), the line goes to that handler
without a ``LogRecord``.  Otherwise it goes through ``Logger.info`` as usual.
The text is the same either way.  Only ``logging`` is imported here: the engine
may use it, and the runtime layer, which configures logging, stays above it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable


class LineLog:
    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def info(self, message: str) -> None:
        logger = self._logger
        if not logger.isEnabledFor(logging.INFO):
            return
        emit_info = _sole_line_writer(logger)
        if emit_info is None or not emit_info(logger.name, message):
            logger.info(message)  # no arguments: the message is not %-formatted


def _sole_line_writer(logger: logging.Logger) -> Callable[[str, str], bool] | None:
    """The root's one handler's ``emit_info``, if a record of ``logger`` at INFO would reach that
    handler and nothing else: no filter or handler on the way, and the handler lets INFO through."""
    node: logging.Logger | None = logger
    while node is not None and node is not logging.root:
        if node.handlers or node.filters or not node.propagate:
            return None
        node = node.parent
    handlers = logging.root.handlers
    if logging.root.filters or len(handlers) != 1:
        return None
    handler = handlers[0]
    if handler.filters or handler.level > logging.INFO:
        return None
    emit_info: Callable[[str, str], bool] | None = getattr(handler, "emit_info", None)
    return emit_info
