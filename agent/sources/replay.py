"""Replay source: recorded CSV files (SKAB layout or comma-separated with a named time column).

Two layouts are read with the stdlib :mod:`csv` module:

* SKAB: ``;``-separated, a header, a ``datetime`` column ``YYYY-MM-DD hh:mm:ss`` (naive = UTC),
  one column per channel and label columns (``anomaly``, ``changepoint``) skipped by name;
* comma- (or tab-) separated with a named time column holding ISO 8601 or epoch seconds or
  milliseconds.

Rows are parsed a chunk at a time into one ``float64`` array (fast path) and only a chunk that
fails is re-parsed row by row, so each bad row is still rejected on its own, in file order, with
``reason`` one of ``field_count``, ``bad_timestamp``, ``non_numeric``, ``non_finite``,
``malformed`` (a row the csv module cannot split) or ``too_long`` (over :data:`MAX_ROW_CHARS`
characters: never read whole, so a hostile line of hundreds of megabytes costs no more memory
than a normal row). Blank lines are skipped silently.

Pacing: row ``i`` is due at ``start_mono + (ts_i - ts_0) / speed`` on the monotonic clock, so a
slow ``emit`` or a late wake-up never accumulates drift; rows already due go out at once.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import math
import operator
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, TextIO

import numpy as np
import numpy.typing as npt
from pydantic import Field

from agent.config.base import StrictModel
from agent.errors import RecordError, SourceError, SourceExhausted, SourceFailed
from agent.records import FloatArray, Reading
from agent.sources.base import Emit, Reject, SourcePlugin, WaitListener, paced_wait
from agent.sources.bounded_lines import BoundedLines
from cloud_sync.isotime import fromisoformat

KIND = "replay"


class ReplayConfig(StrictModel):
    """Config of the ``replay`` source."""

    kind: Literal["replay"] = Field("replay", description="Source kind.")
    path: str = Field(description="CSV file to replay.")
    delimiter: str = Field(
        "auto", description="Field separator: 'auto' (sniff ';' or ','), ';', ',' or '\\t'."
    )
    time_column: str = Field("datetime", description="Name of the timestamp column.")
    time_format: str = Field(
        "auto",
        description="'auto' (ISO 8601 / 'YYYY-MM-DD hh:mm:ss', naive = UTC), 'epoch_s' or "
        "'epoch_ms'.",
    )
    channels: list[str] = Field(
        default_factory=list,
        description="Columns to read, in order; empty = every column except the time column and "
        "ignore_columns.",
    )
    ignore_columns: list[str] = Field(
        default_factory=lambda: ["anomaly", "changepoint"],
        description="Columns never read as channels (labels).",
    )
    speed: float = Field(
        0.0,
        ge=0.0,
        description="Replay speed: 1.0 = real time from the file's timestamps, N = N times faster, "
        "0 = as fast as possible.",
    )
    loop: bool = Field(False, description="Start again at the end of the file.")
    restamp: bool = Field(
        False,
        description="Replace file timestamps with the current time (keeps the file's spacing).",
    )


#: The ``replay`` kind, as the ``edge_agent.sources`` entry point names it.
PLUGIN = SourcePlugin(
    KIND, ReplayConfig, "agent.sources.replay:ReplaySource", path_fields=("path",)
)


_CHUNK_ROWS = 4096
# Epoch seconds stay below 1e11 until the year 5138; epoch milliseconds passed it in 1973.
_EPOCH_MS_THRESHOLD = 1e11
_DELIMITERS = (";", ",", "\t")

Row = tuple[float, FloatArray] | RecordError
BoolArray = npt.NDArray[np.bool_]


def sniff_delimiter(header: str) -> str:
    """Return the most frequent of ``;``, ``,`` and tab in a header line (``,`` if none).

    >>> sniff_delimiter("datetime;Accelerometer1RMS;Current;anomaly")
    ';'
    >>> sniff_delimiter("time,a,b")
    ','
    >>> sniff_delimiter("single")
    ','
    """
    counts = [header.count(d) for d in _DELIMITERS]
    best = max(range(len(_DELIMITERS)), key=counts.__getitem__)
    return _DELIMITERS[best] if counts[best] else ","


def parse_timestamp(text: str, time_format: str = "auto") -> float:
    """Parse one time field into epoch seconds (UTC).

    Args:
        text: The field.
        time_format: ``auto`` (ISO 8601 or ``YYYY-MM-DD hh:mm:ss``, naive = UTC; a plain number is
            epoch seconds, or milliseconds when ``>= 1e11``), ``epoch_s`` or ``epoch_ms``.

    Returns:
        Epoch seconds, finite.

    Raises:
        ValueError: When the field is not a timestamp in that format.

    >>> parse_timestamp("2020-03-09 10:14:33")
    1583748873.0
    >>> parse_timestamp("2020-03-09T11:14:33+01:00")
    1583748873.0
    >>> parse_timestamp("1583748873500")
    1583748873.5
    >>> parse_timestamp("1583748873500", "epoch_ms")
    1583748873.5
    """
    text = text.strip()
    if time_format == "epoch_s":
        value = float(text)
    elif time_format == "epoch_ms":
        value = float(text) / 1000.0
    elif time_format == "auto":
        try:
            parsed = fromisoformat(text)
        except ValueError:
            value = float(text)
            if abs(value) >= _EPOCH_MS_THRESHOLD:
                value /= 1000.0
        else:
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=_dt.timezone.utc)
            value = parsed.timestamp()
    else:
        raise ValueError(f"unknown time_format {time_format!r}")
    if not math.isfinite(value):
        raise ValueError(f"non-finite timestamp {text!r}")
    return value


#: Longest header line read (characters): a header is a few hundred; a longer first line is
#: not a CSV header (a binary file, a JSON dump) and is refused without reading all of it.
MAX_HEADER_CHARS = 65536

#: Longest data row read (characters): a row is a few hundred, a very wide recording a few
#: hundred thousand; a longer line is rejected (``too_long``) after reading at most this much of
#: it, the rest skipped in bounded chunks (:class:`agent.sources.bounded_lines.BoundedLines`).
MAX_ROW_CHARS = 1 << 20


class ReplaySource:
    """Replays a recorded CSV file as a stream of readings.

    The header is read in the constructor, so :attr:`channels` is known before :meth:`run`.

    Args:
        config: The ``replay`` config.
        stream: Stream name stamped on every reading.
        clock: Wall clock, epoch seconds (used for ``restamp``).
        sleep: ``sleep(seconds)`` used for pacing; default ``stop.wait`` (wakes early on stop).
        monotonic: Monotonic clock in seconds (pacing and ``Reading.received_mono``).

    Attributes:
        stream: The stream name.
        channels: Channel column names, in the order of ``Reading.values``.

    Raises:
        SourceError: From the constructor when the file is missing, unreadable or empty, its
            first line is not a CSV header (over ``MAX_HEADER_CHARS``, or a field the csv module
            refuses), lacks the time column, or lacks a configured channel (the message lists the
            columns present).
    """

    def __init__(
        self,
        config: ReplayConfig,
        stream: str,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.stream = stream
        self._path = Path(config.path)
        self._clock = clock
        self._sleep = sleep
        self._monotonic = monotonic
        self._wait_listener: WaitListener | None = None
        header_line = self._read_header_line()
        self._delimiter = (
            sniff_delimiter(header_line) if config.delimiter == "auto" else config.delimiter
        )
        try:
            first = next(csv.reader([header_line], delimiter=self._delimiter))
        except csv.Error as exc:  # a field over the csv module's limit, a NUL byte ...
            raise SourceError(
                f"replay file's header line cannot be read as CSV: {exc}",
                stream=stream,
                path=str(self._path),
            ) from exc
        header = [name.strip() for name in first]
        self._n_fields = len(header)
        if config.time_column not in header:
            raise SourceError(
                f"replay file has no time column {config.time_column!r}; columns present: "
                f"{header}",
                stream=stream,
                path=str(self._path),
            )
        self._time_index = header.index(config.time_column)
        if config.channels:
            missing = [c for c in config.channels if c not in header]
            if missing:
                raise SourceError(
                    f"replay file lacks channel column(s) {missing}; columns present: {header}",
                    stream=stream,
                    path=str(self._path),
                )
            names = list(config.channels)
        else:
            skip = {config.time_column, *config.ignore_columns}
            names = [c for c in header if c not in skip]
            if not names:
                raise SourceError(
                    f"replay file has no channel columns; columns present: {header}",
                    stream=stream,
                    path=str(self._path),
                )
        self.channels: tuple[str, ...] = tuple(names)
        indices = [header.index(c) for c in names]
        getter = operator.itemgetter(*indices)
        self._pick: Callable[[list[str]], tuple[str, ...]] = (
            getter if len(indices) > 1 else (lambda row: (getter(row),))
        )

    def set_wait_listener(self, listener: WaitListener | None) -> None:
        """Announce each pacing wait (a gap in the recording is no stall):
        :class:`agent.sources.base.ReportsWaits`."""
        self._wait_listener = listener

    def _open(self) -> TextIO:
        try:
            return self._path.open(encoding="utf-8-sig", errors="replace", newline="")
        except OSError as exc:
            raise SourceError(
                f"cannot open replay file: {exc.strerror or exc}",
                stream=self.stream,
                path=str(self._path),
            ) from exc

    def _read_header_line(self) -> str:
        with self._open() as f:
            try:
                line = f.readline(MAX_HEADER_CHARS + 1)
            except OSError as exc:
                raise SourceError(
                    f"cannot read replay file: {exc}", stream=self.stream, path=str(self._path)
                ) from exc
        if len(line) > MAX_HEADER_CHARS:
            raise SourceError(
                f"replay file's first line is longer than {MAX_HEADER_CHARS} characters: not a "
                "CSV header (is this the recording?)",
                stream=self.stream,
                path=str(self._path),
            )
        line = line.rstrip("\r\n")
        if not line.strip():
            raise SourceError(
                "replay file is empty (no header)", stream=self.stream, path=str(self._path)
            )
        return line

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        """Replay the file; see :class:`agent.sources.base.Source`.

        Raises:
            SourceExhausted: At the end of the file (never with ``loop``).
            SourceFailed: A pass ended without a single valid row (every row rejected, or
                none at all; with ``loop`` also a later pass, the file emptied or replaced):
                it cannot be replayed, as a camera file without a readable frame.
            SourceError: When the file becomes unreadable.
        """
        wait = self._sleep if self._sleep is not None else stop.wait
        speed = self.config.speed
        start_mono = self._monotonic()
        start_wall = self._clock()
        first_ts: float | None = None
        pass_offset = 0.0
        emitted = 0
        while True:
            pass_first: float | None = None
            pass_last = 0.0
            pass_count = 0
            for row in self._rows():
                if stop.is_set():
                    return
                if isinstance(row, RecordError):
                    reject(row)
                    continue
                ts, values = row
                if first_ts is None:
                    first_ts = ts
                if pass_first is None:
                    pass_first = ts
                pass_last = ts
                pass_count += 1
                elapsed = ts - first_ts + pass_offset
                if speed > 0.0:
                    now = self._monotonic()
                    delay = start_mono + elapsed / speed - now
                    if delay > 0.0:
                        paced_wait(wait, delay, now, self._wait_listener)
                        if stop.is_set():
                            return
                out_ts = start_wall + elapsed if self.config.restamp else ts + pass_offset
                emit(Reading(self.stream, out_ts, values, received_mono=self._monotonic()))
            emitted += pass_count
            if pass_first is None:
                # looped: the file was emptied between passes; a loop never ends normally
                raise SourceFailed("replay file holds no valid row", stream=self.stream,
                                   path=str(self._path))
            if not self.config.loop:
                raise SourceExhausted(
                    "replay file ended", stream=self.stream, path=str(self._path), readings=emitted
                )
            # Next pass continues the timeline: shift by the span plus one mean sample spacing.
            span = pass_last - pass_first
            step = span / (pass_count - 1) if pass_count > 1 and span > 0 else 1.0
            pass_offset += span + step

    def _rows(self) -> Iterator[Row]:
        """Yield every data row of one pass, in file order, parsed or as a RecordError.

        Lines come through :class:`BoundedLines`: a row over :data:`MAX_ROW_CHARS` is skipped
        in bounded chunks and rejected (``too_long``), never read whole.
        """
        with self._open() as f:
            lines = BoundedLines(f, MAX_ROW_CHARS)
            reader = csv.reader(lines, delimiter=self._delimiter)
            try:
                with contextlib.suppress(RecordError, csv.Error):
                    next(reader, None)  # header (checked by the constructor)
                chunk: list[tuple[int, list[str]]] = []
                while True:
                    lines.start_record()
                    try:
                        row = next(reader)
                    except StopIteration:
                        break
                    except (RecordError, csv.Error) as exc:
                        yield from self._parse_chunk(chunk)  # the rows before it come first
                        chunk = []
                        yield exc if isinstance(exc, RecordError) else RecordError(
                            f"malformed row: {exc}", reason="malformed", line=lines.line_num
                        )
                        continue
                    if not row or (len(row) == 1 and not row[0].strip()):
                        continue  # blank line
                    chunk.append((lines.line_num, row))
                    if len(chunk) >= _CHUNK_ROWS:
                        yield from self._parse_chunk(chunk)
                        chunk = []
                yield from self._parse_chunk(chunk)
            except OSError as exc:
                raise SourceError(
                    f"cannot read replay file: {exc}", stream=self.stream, path=str(self._path)
                ) from exc

    def _parse_chunk(self, chunk: list[tuple[int, list[str]]]) -> list[Row]:
        """Parse rows into readings or errors: one vectorised conversion, per-row on failure."""
        out: list[Row | None] = [None] * len(chunk)
        positions: list[int] = []
        stamps: list[float] = []
        fields: list[tuple[str, ...]] = []
        time_format = self.config.time_format
        for pos, (line, row) in enumerate(chunk):
            if len(row) != self._n_fields:
                out[pos] = RecordError(
                    f"row has {len(row)} fields, header has {self._n_fields}",
                    reason="field_count",
                    line=line,
                )
                continue
            try:
                stamps.append(parse_timestamp(row[self._time_index], time_format))
            except ValueError:
                out[pos] = RecordError(
                    f"bad timestamp {row[self._time_index]!r}", reason="bad_timestamp", line=line
                )
                continue
            positions.append(pos)
            fields.append(self._pick(row))
        if positions:
            values = self._to_array(fields, [chunk[p][0] for p in positions], positions, out)
            finite: BoolArray = np.all(np.isfinite(values), axis=1)
            for k, pos in enumerate(positions):
                if out[pos] is not None:
                    continue
                if not finite[k]:
                    out[pos] = RecordError(
                        "non-finite value", reason="non_finite", line=chunk[pos][0]
                    )
                else:
                    out[pos] = (stamps[k], values[k].copy())
        return [r for r in out if r is not None]

    @staticmethod
    def _to_array(
        fields: list[tuple[str, ...]],
        lines: list[int],
        positions: list[int],
        out: list[Row | None],
    ) -> FloatArray:
        """Convert all rows at once; if any field is not a number, redo row by row.

        Rows that fail get a ``non_numeric`` error in ``out`` and NaN in the returned array.
        """
        try:
            return np.array(fields, dtype=np.float64)
        except ValueError:
            pass
        values = np.full((len(fields), len(fields[0])), np.nan)
        for k, row in enumerate(fields):
            try:
                values[k] = np.array(row, dtype=np.float64)
            except ValueError:
                out[positions[k]] = RecordError(
                    f"non-numeric value in {list(row)}", reason="non_numeric", line=lines[k]
                )
        return values
