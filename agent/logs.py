"""Logging set-up: text or JSON lines on stderr (journald adds the timestamp under systemd).

Repeated messages are rate-limited (:class:`RateLimitFilter`): the same logger, message
*template* (``record.msg`` before ``%`` formatting) and *string* arguments pass at most once per
``interval_s``; the next one that passes says how many were suppressed. String arguments name
things (a stream, a reject reason, an update state), so "stream %s calibrated" for two streams
are two messages; numbers (counts, values, durations) are ignored, so "disk %d full" repeating
with a new count each time is one message. Components that already limit themselves (the source
supervisor) are unaffected, since their repeats are rarer than the interval.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable

#: Default seconds between two records of the same logger and template.
RATE_LIMIT_S = 30.0


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (epoch s), level, logger, message, and exc if any."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        suppressed = getattr(record, "suppressed", None)
        if suppressed:
            obj["suppressed"] = suppressed
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False)


#: ``log.info(..., extra=ALWAYS)``: never rate-limited (:class:`RateLimitFilter`).
ALWAYS: dict[str, object] = {"always": True}


class RateLimitFilter(logging.Filter):
    """Lets the same (logger, template, string arguments) through at most once per ``interval_s``.

    A record that passes after others were suppressed gets `` [N similar messages suppressed in
    the last S s]`` appended to its template, and ``suppressed = N`` as an attribute (the JSON
    formatter emits it). Thread-safe. A record logged with ``extra=ALWAYS`` (operator events
    that happen once each: a SIGHUP, a reload's outcome) always passes and is not counted.

    Args:
        interval_s: Seconds between two records of the same key; 0 = no limit.
        monotonic: Monotonic clock in seconds.

    >>> now = [0.0]
    >>> f = RateLimitFilter(10.0, lambda: now[0])
    >>> rec = lambda: logging.LogRecord("x", logging.WARNING, "", 0, "port %s gone", ("a",), None)
    >>> [f.filter(rec()) for _ in range(3)]
    [True, False, False]
    >>> now[0] = 11.0; r = rec(); f.filter(r), r.getMessage()
    (True, 'port a gone [2 similar messages suppressed in the last 11 s]')
    >>> other = logging.LogRecord("x", logging.WARNING, "", 0, "port %s gone", ("b",), None)
    >>> f.filter(other)
    True
    """

    def __init__(
        self, interval_s: float = RATE_LIMIT_S, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str, tuple[str, ...]], float] = {}
        self._suppressed: dict[tuple[str, str, tuple[str, ...]], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True when ``record`` may be emitted (see the class docstring)."""
        if self.interval_s <= 0 or getattr(record, "always", False):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        key = (record.name, str(record.msg), tuple(a for a in args if isinstance(a, str)))
        now = self._monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            count = self._suppressed.pop(key, 0)
            if len(self._last) > 10_000:  # bound the memory: forget keys older than the interval
                self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
        if count:
            since = now - last if last is not None else self.interval_s
            record.msg = (
                f"{record.msg} [{count} similar messages suppressed in the last {since:.0f} s]"
            )
            record.suppressed = count
        return True


def setup_logging(level: str, fmt: str, rate_limit_s: float = RATE_LIMIT_S) -> None:
    """Configure the root logger once (replaces earlier handlers).

    Args:
        level: DEBUG, INFO, WARNING or ERROR.
        fmt: ``text`` or ``json``.
        rate_limit_s: Seconds between two records of the same logger and message template
            (:class:`RateLimitFilter`); 0 = no limit.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RateLimitFilter(rate_limit_s))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
