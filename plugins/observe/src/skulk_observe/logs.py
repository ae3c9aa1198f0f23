"""Logs for operators: the recent lines a capture bundle carries, and JSON lines on request.

`SKULK_LOG_FORMAT=json` turns the node's log lines into one JSON object each (time, level, logger,
message, exception), which log shippers read without a regex. The kernel's CLI owns the handlers;
this plugin only swaps their formatter in `configure`, so the switch needs no kernel change.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False)


def apply_log_format(fmt: str | None = None) -> bool:
    """Switch the root handlers to JSON when `fmt` (default: $SKULK_LOG_FORMAT) is "json"."""
    fmt = (fmt if fmt is not None else os.environ.get("SKULK_LOG_FORMAT", "")).strip().lower()
    if fmt != "json":
        return False
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO)
    for handler in root.handlers:
        if not isinstance(handler, LogRing):
            handler.setFormatter(JsonFormatter())
    return True


class LogRing(logging.Handler):
    """The last `size` formatted log lines of this process, for capture bundles."""

    def __init__(self, size: int) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: deque[str] = deque(maxlen=max(size, 1))
        self.enabled = size > 0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if not self.enabled:
            return
        try:
            self.lines.append(self.format(record))
        except Exception:  # a log line must never break the caller
            self.handleError(record)

    def install(self) -> None:
        root = logging.getLogger()
        if self.enabled and self not in root.handlers:
            root.addHandler(self)

    def uninstall(self) -> None:
        logging.getLogger().removeHandler(self)
