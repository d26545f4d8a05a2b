"""Log set-up: readable text for people, one JSON object per line for log collectors.

One record is always one line. Device IDs and other values in messages can come from a
request (a kubelet, or anything that can reach the socket) or from a damaged sysfs file, so
a newline or a terminal escape inside one must not forge a log line or rewrite the screen:
control characters are escaped in both formats, by the formatter, for every log call.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]
_TEXT_ESCAPES = {c: f"\\u{c:04x}" if c > 0xFF else f"\\x{c:02x}" for c in _CONTROLS}
_TEXT_ESCAPES |= {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in _CONTROLS if c >= 0x7F}
"""json.dumps escapes C0 controls itself; DEL, C1 and the Unicode line separators it leaves
raw (valid JSON, but some readers break lines on them and terminals obey C1 codes)."""


def escape_controls(text: str) -> str:
    """``text`` with every control character written as an escape, so it stays one line."""
    return text.translate(_TEXT_ESCAPES)


class TextFormatter(logging.Formatter):
    """The plain format, with control characters in the message escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One self-contained JSON object per record, with the fields collectors index."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        audit = getattr(record, "audit", None)
        if isinstance(audit, dict):
            entry["audit"] = audit  # plugin.serving.dra.function_audit: fields to index
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False).translate(_JSON_ESCAPES)


def configure(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        )
    # Nothing logged here names a source line, thread or process, and finding the caller
    # walks the stack on every record, an Allocate's included (the logging HOWTO's
    # "Optimization" section).
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # gRPC's own loggers are chatty at debug and say nothing users can act on.
    logging.getLogger("grpc").setLevel(max(root.level, logging.WARNING))
    logging.getLogger("asyncio").setLevel(max(root.level, logging.WARNING))
    # The API server client's HTTP layer logs every request at INFO: a line per claim read
    # and per slice write, none of which a user acts on (failures are logged by the driver).
    for chatty in ("httpx2", "httpcore2", "lightkube"):
        logging.getLogger(chatty).setLevel(max(root.level, logging.WARNING))
