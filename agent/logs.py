"""Logging set-up: text or JSON lines on stderr (journald adds the timestamp under systemd).

Repeated messages are rate-limited (:class:`RateLimitFilter`): the same logger, message
*template* (``record.msg`` before ``%`` formatting) and *string* arguments pass at most once per
``interval_s``; the next one that passes says how many were suppressed. String arguments name
things (a stream, a reject reason, an update state), so "stream %s calibrated" for two streams
are two messages; numbers (counts, values, durations) are ignored, so "disk %d full" repeating
with a new count each time is one message. Components that summarise their own repeats (the
source supervisor's rejected records) use the same :class:`RateLimiter`, less often than the
interval, so their summaries always pass.

State changes are never de-duplicated: a source going down or recovering, a stream starting, a
reload and the final ``stopped: ...`` summary are logged with ``extra=ALWAYS``, and a reload
(:func:`reset_rate_limits`) lets the restarted components' start lines through once more.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Hashable

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


#: ``log.info(..., extra=ALWAYS)``: a state change (source down or recovered, a stream starting,
#: a reload, the final ``stopped: ...`` line), never rate-limited (:class:`RateLimitFilter`).
ALWAYS: dict[str, object] = {"always": True}


class RateLimiter:
    """Allows one event per key per interval and counts the ones it suppresses.

    The one rate limiter of the agent: :class:`RateLimitFilter` uses it for every log record,
    and components that summarise their own repeats (the source supervisor's rejected records,
    a camera stream's) use it directly. Thread-safe; at most ``max_keys`` keys are remembered
    (keys older than the interval are forgotten first).

    Args:
        interval_s: Seconds between two allowed events of the same key; 0 = no limit.
        monotonic: Monotonic clock in seconds.
        max_keys: Bound on the keys remembered.

    >>> now = [0.0]
    >>> rl = RateLimiter(60.0, lambda: now[0])
    >>> rl.hit("x"), rl.hit("x"), rl.hit("x")
    (0, None, None)
    >>> now[0] = 61.0; rl.hit("x")
    2
    """

    def __init__(
        self,
        interval_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        self.interval_s = interval_s
        self._monotonic = monotonic
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def hit(self, key: Hashable) -> int | None:
        """Record one event.

        Returns:
            None when the event should be suppressed; otherwise the number of events of this key
            suppressed since the last allowed one.
        """
        if self.interval_s <= 0:
            return 0
        now = self._monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            self._last[key] = now
            if len(self._last) > self._max_keys:
                self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
            return self._suppressed.pop(key, 0)

    def since(self, key: Hashable) -> float:
        """Seconds since the last allowed event of ``key`` (the interval when unknown)."""
        last = self._last.get(key)
        return self.interval_s if last is None else self._monotonic() - last

    def reset(self) -> None:
        """Forget when each key last passed (its next event passes); keep the suppressed
        counts, so that event still reports them."""
        with self._lock:
            self._last.clear()

    def drain(self) -> dict[Hashable, int]:
        """Return and clear the counts of suppressed events not yet reported, by key."""
        with self._lock:
            pending, self._suppressed = self._suppressed, {}
        return pending


class RateLimitFilter(logging.Filter):
    """Lets the same (logger, template, string arguments) through at most once per ``interval_s``.

    A record that passes after others were suppressed gets `` [N similar messages suppressed in
    the last S s]`` appended to its template, and ``suppressed = N`` as an attribute (the JSON
    formatter emits it). Thread-safe. A record logged with ``extra=ALWAYS`` (a state change:
    source down or recovered, a stream starting, a SIGHUP and its outcome, the final summary)
    always passes and is not counted; :func:`reset_rate_limits` (a reload) lets the next record
    of every key pass once.

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
        self.limiter = RateLimiter(interval_s, monotonic)

    @property
    def interval_s(self) -> float:
        """Seconds between two records of the same key (0 = no limit); settable."""
        return self.limiter.interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        self.limiter.interval_s = value

    def filter(self, record: logging.LogRecord) -> bool:
        """True when ``record`` may be emitted (see the class docstring)."""
        if self.interval_s <= 0 or getattr(record, "always", False):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        key = (record.name, str(record.msg), tuple(a for a in args if isinstance(a, str)))
        since = self.limiter.since(key)
        count = self.limiter.hit(key)
        if count is None:
            return False
        if count:
            record.msg = (
                f"{record.msg} [{count} similar messages suppressed in the last {since:.0f} s]"
            )
            record.suppressed = count
        return True


def reset_rate_limits(logger: logging.Logger | None = None) -> None:
    """Let the next record of every key pass once (a reload: the restarted components' start
    lines are new events), on every :class:`RateLimitFilter` of ``logger``'s handlers (default
    the root logger)."""
    for handler in (logger or logging.getLogger()).handlers:
        for flt in handler.filters:
            if isinstance(flt, RateLimitFilter):
                flt.limiter.reset()


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
