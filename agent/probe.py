"""``edge-agent probe``: open a config's sources and show what they read (commissioning).

What ``telegraf --test`` is to Telegraf: every selected stream's source runs for ``--seconds``;
each reading is printed (time, channel values), each rejected record with its reason (a
reading outside the stream's ``valid_range`` or a float32's range too, as ``run`` rejects it:
``out_of_range``), each outage and recovery the source reports. Nothing is scored, stored or
published: no model is loaded, no broker or fleet is contacted.

Text output, one line per event::

    2026-12-01T20:38:01.123Z plc  pressure=2.5 temp=-12.3
    2026-12-01T20:38:01.224Z plc  REJECTED timeout: no response from unit 1 ...
    2026-12-01T20:38:02.001Z plc  DOWN cannot connect to Modbus device ...

``--json``: one JSON object per line (``{"stream", "time", "ts", "values": {channel: value}}``,
``{"stream", "time", "rejected": reason, "message"}``, ``{"stream", "time", "down": message}``
or ``"up": true``), then one summary object per stream (``{"stream", "summary": {"readings",
"rejected": {reason: count}, "errors"}}``).

Exit status: 0 when every probed stream delivered at least one reading (or frame), 1
(``EX_FAILURE``) when one delivered nothing, 78 for a config problem.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from agent.config.schema import AgentConfig, StreamConfig
from agent.errors import AgentError, ConfigError, RecordError, SourceError, SourceExhausted
from agent.exitcodes import EX_FAILURE, EX_OK
from agent.records import iso_utc
from agent.sources.base import ReportsStatus
from agent.sources.registry import build_source
from agent.sources.valid_range import ValidRange

#: Seconds between two attempts of a source that failed (a probe does not back off further).
RETRY_S = 1.0


@dataclass
class StreamReport:
    """What one stream's source delivered during a probe."""

    stream: str
    readings: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    errors: int = 0


class Printer:
    """Writes probe events to ``out`` (text or JSON lines), serialised across threads."""

    def __init__(self, out: TextIO, as_json: bool, clock: Callable[[], float]) -> None:
        self._out, self._json, self._clock = out, as_json, clock
        self._lock = threading.Lock()

    def event(self, stream: str, text: str, **fields: Any) -> None:
        """One line: ``time stream text`` or a JSON object with ``fields``."""
        now = fields.pop("ts", None)
        ts = float(now) if now is not None else self._clock()
        if self._json:
            line = json.dumps({"stream": stream, "time": iso_utc(ts), "ts": round(ts, 6),
                               **fields}, allow_nan=False, default=str)
        else:
            line = f"{iso_utc(ts)} {stream}  {text}"
        with self._lock:
            print(line, file=self._out, flush=True)

    def summary(self, report: StreamReport) -> None:
        """The stream's totals."""
        rejected = dict(sorted(report.rejected.items()))
        if self._json:
            line = json.dumps({"stream": report.stream, "summary": {
                "readings": report.readings, "rejected": rejected, "errors": report.errors}})
        else:
            why = ", ".join(f"{k} {v}" for k, v in rejected.items()) or "none"
            line = (f"{report.stream}: {report.readings} readings, "
                    f"{sum(rejected.values())} rejected ({why}), {report.errors} errors")
        with self._lock:
            print(line, file=self._out, flush=True)


def _values(item: Any, channels: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """A reading's text and JSON fields; a camera frame's shape."""
    values = getattr(item, "values", None)
    if values is not None:
        pairs = {c: float(v) for c, v in zip(channels, values.tolist(), strict=True)}
        text = " ".join(f"{c}={v:.6g}" for c, v in pairs.items())
        return text, {"values": {c: (v if math.isfinite(v) else None) for c, v in pairs.items()}}
    shape = list(getattr(getattr(item, "image", None), "shape", ()))
    origin = getattr(item, "origin", None)
    where = f" {origin.file}" if origin is not None else ""
    return f"frame {'x'.join(map(str, shape))}{where}", {"frame": shape}


def _run_stream(sc: StreamConfig, printer: Printer, report: StreamReport,
                stop: threading.Event) -> None:
    try:
        source = build_source(sc.source, sc.name)
    except AgentError as exc:
        report.errors += 1
        printer.event(sc.name, f"ERROR {exc}", error=str(exc))
        return
    channels = tuple(getattr(source, "channels", ()))
    try:  # the bounds `run` applies after the source (agent.services.supervisor)
        valid = ValidRange(channels, {r.channel: (r.low, r.high)
                                      for r in getattr(sc, "valid_range", ())})
    except ValueError as exc:
        report.errors += 1
        printer.event(sc.name, f"ERROR streams.{sc.name}.valid_range: {exc}", error=str(exc))
        return

    def emit(item: Any) -> None:
        values = getattr(item, "values", None)
        invalid = None if values is None else valid.check(values)
        if invalid is not None:
            reject(invalid)
            return
        report.readings += 1
        text, fields = _values(item, channels)
        printer.event(sc.name, text, ts=getattr(item, "ts", None), **fields)

    def reject(error: RecordError) -> None:
        report.rejected[error.reason] += 1
        printer.event(sc.name, f"REJECTED {error.reason}: {error}", rejected=error.reason,
                      message=str(error))

    def status(error: SourceError | None) -> None:
        if error is None:
            printer.event(sc.name, "UP", up=True)
        else:
            report.errors += 1
            printer.event(sc.name, f"DOWN {error}", down=str(error))

    if isinstance(source, ReportsStatus):
        source.set_status_listener(status)
    while not stop.is_set():
        try:
            source.run(emit, reject, stop)
            return
        except SourceExhausted as exc:
            printer.event(sc.name, f"END {exc}", end=str(exc))
            return
        except AgentError as exc:
            report.errors += 1
            printer.event(sc.name, f"ERROR {exc}", error=str(exc))
            if not exc.retryable:
                return
        except Exception as exc:  # a plugin bug: shown, not fatal to the probe
            report.errors += 1
            printer.event(sc.name, f"ERROR {type(exc).__name__}: {exc}", error=repr(exc))
        stop.wait(RETRY_S)


def probe(config: AgentConfig, out: TextIO, *, stream: str | None = None, seconds: float = 5.0,
          as_json: bool = False, clock: Callable[[], float] = time.time) -> int:
    """Run the sources of ``config`` (one, with ``stream``) for ``seconds``; print what they read.

    Args:
        config: A resolved config (absolute paths).
        out: Where to print.
        stream: Only this stream; None = every stream.
        seconds: How long to read, > 0.
        as_json: JSON lines instead of text.
        clock: Wall clock for events without a timestamp of their own.

    Returns:
        0 when every probed stream delivered something, 1 otherwise.

    Raises:
        ConfigError: ``stream`` names no configured stream.
    """
    streams = [sc for sc in config.streams if stream is None or sc.name == stream]
    if not streams:
        names = ", ".join(sc.name for sc in config.streams)
        raise ConfigError(f"no stream named {stream!r}", [f"--stream: no stream named "
                                                          f"{stream!r} (streams: {names})"])
    printer = Printer(out, as_json, clock)
    stop = threading.Event()
    reports = [StreamReport(sc.name) for sc in streams]
    threads = [threading.Thread(target=_run_stream, args=(sc, printer, rep, stop), daemon=True,
                                name=f"probe-{sc.name}") for sc, rep in zip(streams, reports,
                                                                            strict=True)]
    for thread in threads:
        thread.start()
    try:
        stop.wait(seconds)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10.0)
    for rep in reports:
        printer.summary(rep)
    return EX_OK if all(rep.readings for rep in reports) else EX_FAILURE
