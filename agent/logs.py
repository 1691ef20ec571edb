"""Logging set-up: text or JSON lines on stderr (journald adds the timestamp under systemd)."""

from __future__ import annotations

import json
import logging
import sys


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (epoch s), level, logger, message, and exc if any."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False)


def setup_logging(level: str, fmt: str) -> None:
    """Configure the root logger once (replaces earlier handlers).

    Args:
        level: DEBUG, INFO, WARNING or ERROR.
        fmt: ``text`` or ``json``.
    """
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
