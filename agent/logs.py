"""Logging set-up: text, journal or JSON lines on stderr, and the agent's one rate limiter.

Formats (``agent.log_format``, ``edge-agent run --log-format``):

* ``text``: ``2024-03-09 11:14:33,120 INFO    agent.app: message`` (a terminal, a file);
* ``journal``: ``<6>INFO agent.app: message``: the sd-daemon(3) priority prefix (``<3>``
  SD_ERR for ERROR, ``<4>`` SD_WARNING, ``<6>`` SD_INFO, ``<7>`` SD_DEBUG, ``<2>`` SD_CRIT for
  CRITICAL) and no timestamp: journald strips the prefix into the entry's PRIORITY and stamps
  the entry itself (systemd.exec(5), ``SyslogLevelPrefix=``). Every line of a multi-line record
  (a traceback) carries the prefix, so the whole record has one priority;
* ``json``: one object per line: ``ts`` (epoch s), ``level``, ``logger``, ``message``, ``exc``
  (a traceback), ``suppressed`` (see below), and every structured field the call site passed
  with ``extra=`` (``stream``, ``alert_id``, ``model_version``, ``device`` ...) as a top-level
  key, for a log shipper to index. Under journald each object is prefixed with its priority
  as well (journald removes it; the MESSAGE stays valid JSON);
* ``auto`` (default): ``journal`` when stderr is the journal stream systemd passed
  (``JOURNAL_STREAM`` names stderr's device and inode: :func:`under_journal`), else ``text``.

Structured fields: components that log about one stream, alert or model pass its identity as
fields (:func:`with_fields`: a logger whose records all carry them, merged with a call's own
``extra=``); the text and journal formats show only the message, which names them too.

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
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable, Mapping, MutableMapping
from typing import IO, Any, Literal

LogFormat = Literal["auto", "text", "journal", "json"]

#: Default seconds between two records of the same logger and template.
RATE_LIMIT_S = 30.0


#: Attributes every LogRecord has (and the formatters' own): not structured fields.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "always", "suppressed", "taskName",
}


def syslog_priority(levelno: int) -> int:
    """The sd-daemon(3) / syslog(3) priority of a logging level.

    >>> [syslog_priority(lv) for lv in (logging.CRITICAL, logging.ERROR, logging.WARNING,
    ...                                  logging.INFO, logging.DEBUG)]
    [2, 3, 4, 6, 7]
    """
    if levelno >= logging.CRITICAL:
        return 2  # SD_CRIT
    if levelno >= logging.ERROR:
        return 3  # SD_ERR
    if levelno >= logging.WARNING:
        return 4  # SD_WARNING
    if levelno >= logging.INFO:
        return 6  # SD_INFO
    return 7  # SD_DEBUG


def structured_fields(record: logging.LogRecord) -> dict[str, object]:
    """The fields a call site passed with ``extra=`` (not the record's own attributes)."""
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS
            and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (epoch s), level, logger, message, exc if any, and the
    structured fields (see the module docstring).

    Args:
        priority_prefix: Prefix each line with its sd-daemon(3) priority (under journald).
    """

    def __init__(self, priority_prefix: bool = False) -> None:
        super().__init__()
        self.priority_prefix = priority_prefix

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (fields that are not JSON become their ``str``)."""
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
        for key, value in structured_fields(record).items():
            obj.setdefault(key, value)  # the standard keys win over a field of the same name
        line = json.dumps(obj, ensure_ascii=False, default=str)
        if self.priority_prefix:
            return f"<{syslog_priority(record.levelno)}>{line}"
        return line


class JournalFormatter(logging.Formatter):
    """``<priority>LEVEL logger: message`` with no timestamp (journald adds its own); every
    line of a multi-line record (a traceback) carries the prefix.

    >>> rec = logging.LogRecord("agent.app", logging.WARNING, "", 0, "a\\nb", None, None)
    >>> JournalFormatter().format(rec).splitlines()
    ['<4>WARNING agent.app: a', '<4>b']
    """

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The record's lines, each with the priority prefix."""
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


def under_journal(
    stream: IO[str] | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """True when ``stream`` (default stderr) is the journal stream systemd connected.

    systemd.exec(5): ``JOURNAL_STREAM`` is ``<device>:<inode>`` of the stdout/stderr it
    connected to journald; a process should compare it with its own stream's ``fstat`` (a
    child whose stderr was redirected inherits the variable but not the stream).
    """
    env = os.environ if environ is None else environ
    value = env.get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat((sys.stderr if stream is None else stream).fileno())
    except (OSError, ValueError, AttributeError):
        return False  # no file descriptor (a test's StringIO, a closed stream)
    return st.st_dev == int(dev) and st.st_ino == int(ino)


class FieldsAdapter(logging.LoggerAdapter):  # type: ignore[type-arg] # not subscriptable in 3.10
    """A logger whose records carry ``fields`` as structured fields (:func:`with_fields`)."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Merge the fields under the call's own ``extra=`` (the call's keys win)."""
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def with_fields(
    logger: logging.Logger | logging.LoggerAdapter[Any], **fields: object
) -> FieldsAdapter:
    """``logger`` whose every record carries ``fields`` (``stream=``, ``model_version=`` ...);
    a call's own ``extra=`` (``ALWAYS``, more fields) is merged in.

    >>> log = with_fields(logging.getLogger("x"), stream="pump1")
    >>> log.process("m", {"extra": {"always": True}})[1]["extra"]
    {'stream': 'pump1', 'always': True}
    """
    if isinstance(logger, FieldsAdapter):
        return FieldsAdapter(logger.logger, {**(logger.extra or {}), **fields})
    base = logger.logger if isinstance(logger, logging.LoggerAdapter) else logger
    return FieldsAdapter(base, fields)


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


def formatter_for(
    fmt: LogFormat, stream: IO[str] | None = None, environ: Mapping[str, str] | None = None
) -> logging.Formatter:
    """The formatter of ``fmt`` for ``stream`` (``auto``: journal under journald, else text;
    ``json`` gets the priority prefix under journald).

    Raises:
        ValueError: an unknown format.
    """
    journal = under_journal(stream, environ)
    if fmt == "auto":
        fmt = "journal" if journal else "text"
    if fmt == "journal":
        return JournalFormatter()
    if fmt == "json":
        return JsonFormatter(priority_prefix=journal)
    if fmt == "text":
        return logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    raise ValueError(f"unknown log format {fmt!r} (auto, text, journal or json)")


def setup_logging(
    level: str,
    fmt: LogFormat = "auto",
    rate_limit_s: float = RATE_LIMIT_S,
    stream: IO[str] | None = None,
) -> None:
    """Configure the root logger once (replaces earlier handlers).

    Args:
        level: DEBUG, INFO, WARNING or ERROR.
        fmt: ``auto``, ``text``, ``journal`` or ``json`` (the module docstring).
        rate_limit_s: Seconds between two records of the same logger and message template
            (:class:`RateLimitFilter`); 0 = no limit.
        stream: Where lines go; default stderr.

    Raises:
        ValueError: an unknown format.
    """
    out = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(out)
    handler.addFilter(RateLimitFilter(rate_limit_s))
    handler.setFormatter(formatter_for(fmt, out))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
