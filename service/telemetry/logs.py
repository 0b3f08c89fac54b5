"""Logging setup: plain text, or one JSON object per line carrying trace_id and span_id."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

# LogRecord attributes that are not user-supplied `extra=` fields.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", "trace_id", "span_id", ...extra}` per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            out["trace_id"] = format(ctx.trace_id, "032x")
            out["span_id"] = format(ctx.span_id, "016x")
            out["trace_flags"] = format(int(ctx.trace_flags), "02x")
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool) else repr(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class _WorkerTag(logging.Filter):
    """Adds `worker` (fairgate serve --workers: whose line is it) to every record."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        return True


def configure_logging(level: str, log_format: str = "text", worker: int | None = None) -> None:
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    elif worker is None:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    else:
        handler.setFormatter(
            logging.Formatter(TEXT_FORMAT.replace(" %(name)s", " w%(worker)s %(name)s"))
        )
    if worker is not None:
        handler.addFilter(_WorkerTag(worker))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
