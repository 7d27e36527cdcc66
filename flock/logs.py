"""Structured logging: one JSON object a line, carrying the request's context.

Context (container ID, pod, operation) lives in a ContextVar, so every Trio task
inherits the fields of the task that spawned it and a request handler sets them
once with :func:`bound`.  Any ``extra={...}`` given to a log call is merged in.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

# Read-only: a context is replaced (``set``), never changed in place.
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "flock_log_context", default=MappingProxyType({})
)

# Attributes every LogRecord has; anything else came from ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


@contextlib.contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Add *fields* (e.g. ``container_id=…, pod="ns/name", op="ADD"``) to every
    record logged in this context and in tasks started from it."""
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def current() -> dict[str, Any]:
    return dict(_context.get())


# One encoder for every line (``json.dumps`` with options builds a new one per call).
_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))


class JsonFormatter(logging.Formatter):
    # The "YYYY-mm-ddTHH:MM:SS" of the last second formatted: lines come many to a second.
    _second: int = -1
    _stamp: str = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        entry: dict[str, Any] = {
            "ts": f"{self._stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_context.get())
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)


class TextFormatter(logging.Formatter):
    """For a person at a terminal: the message, then the context as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {**_context.get()}
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                fields[key] = value
        tail = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{record.levelname[0]} {record.name}: {record.getMessage()}"
        if tail:
            line += "  " + tail
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str = "info", fmt: str = "json", stream: Any = None) -> None:
    """Install one handler on the root logger (replacing any earlier one)."""
    # Neither format shows where a call was made from nor the thread or process: skip
    # collecting them for every record (the logging HOWTO's "Optimization" switches).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
