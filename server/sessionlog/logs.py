"""Logging for the server: one line per notable event, JSON when nobody is watching.

``extra`` fields of a log call become JSON keys (or ``key=value`` in text mode). Log calls pass
names, ids, counts and reasons; never tokens and never event data.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_extra(record))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """A readable line for a terminal: time, level, message, key=value extras."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extras = "".join(f" {k}={v}" for k, v in _extra(record).items())
        line = f"{stamp} {record.levelname:<7} {record.getMessage()}{extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


_GRPC_UNDECODABLE = ("grpc._cython.cygrpc", "Invalid encoding on %s")
"""grpc's own log call for metadata that is not UTF-8: it prints the raw value, which for an
``authorization`` header is a (mistyped) secret, with a traceback, at error level."""


def withhold_undecodable_metadata(record: logging.LogRecord) -> bool:
    """Rewrite grpc's "Invalid encoding" record to one info line without the value: any client
    can send such bytes, and the value may be a bearer token."""
    if (record.name, record.msg) == _GRPC_UNDECODABLE:
        record.msg = "a request carried metadata that is not valid UTF-8; its value is withheld"
        record.args = None
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.INFO, "INFO"
    return True


def configure(
    level: str = "info",
    fmt: str = "auto",
    stream: TextIO | None = None,
    fields: Mapping[str, Any] | None = None,
) -> None:
    """Send sessionlog's logs to ``stream`` (stderr) as JSON or text; ``auto`` picks JSON unless
    the stream is a terminal. ``fields`` go on every line (a worker's number, say: the workers
    of one server write one stream)."""
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    handler.addFilter(withhold_undecodable_metadata)
    if fields:
        stamp = dict(fields)

        def add_fields(record: logging.LogRecord) -> bool:
            for key, value in stamp.items():
                setattr(record, key, value)
            return True

        handler.addFilter(add_fields)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
