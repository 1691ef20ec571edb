"""Line framing and parsing for line-oriented sources (serial): bytes in, records out, no I/O.

Lines end in ``\\n`` or ``\\r\\n``; a line split across reads is reassembled. The reject
reasons are listed in :mod:`agent.sources.serial`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from agent.errors import RecordError
from agent.records import FloatArray

_KV_SPLIT = re.compile(r"[,\s]+")


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """One accepted line.

    Attributes:
        ts: Epoch seconds from the line's timestamp field, or None (use the receive time).
        values: Shape ``(C,)``, float64, finite, in channel order.
    """

    ts: float | None
    values: FloatArray


class LineParser:
    """Splits a byte stream into lines and parses each into channel values (no I/O).

    Args:
        channels: Channel names, in order (C of them).
        fmt: ``csv`` (values in channel order) or ``kv`` (``key=value`` separated by ``,`` or
            whitespace).
        delimiter: csv field separator.
        timestamp_field: csv: the first field is epoch seconds; kv: the ``ts`` key is.
        max_line_bytes: Longest accepted line, excluding its terminator.
        inter_byte_timeout_s: A partial line whose last byte is older than this many seconds
            is discarded (``stale_partial``) when more bytes come; None = never.

    >>> p = LineParser(["a", "b"])
    >>> p.feed(b"1.5,2")
    []
    >>> [r.values.tolist() for r in p.feed(b"\\r\\n3,4\\n")]
    [[1.5, 2.0], [3.0, 4.0]]
    >>> [e.reason for e in p.feed(b"1,x\\n1,nan\\n1\\n\\xff,1\\n")]
    ['non_numeric', 'non_finite', 'field_count', 'not_utf8']
    >>> kv = LineParser(["a", "b"], fmt="kv", timestamp_field=True)
    >>> r = kv.parse_line(b"ts=100.5 b=2 a=1 extra=9")
    >>> r.ts, r.values.tolist()
    (100.5, [1.0, 2.0])
    """

    def __init__(
        self,
        channels: list[str] | tuple[str, ...],
        fmt: Literal["csv", "kv"] = "csv",
        delimiter: str = ",",
        timestamp_field: bool = False,
        max_line_bytes: int = 1024,
        inter_byte_timeout_s: float | None = None,
    ) -> None:
        if not channels:
            raise ValueError("LineParser needs at least one channel")
        self.channels = tuple(channels)
        self.fmt = fmt
        self.delimiter = delimiter
        self.timestamp_field = timestamp_field
        self.max_line_bytes = max_line_bytes
        self.inter_byte_timeout_s = inter_byte_timeout_s
        self._buffer = bytearray()
        self._discarding = False
        self._last_byte: float | None = None

    def reset(self) -> None:
        """Drop any partial line (after a reconnect, the rest of it is gone)."""
        self._buffer.clear()
        self._discarding = False
        self._last_byte = None

    def expire(self, now: float) -> RecordError | None:
        """Discard the partial line when its last byte is older than the inter-byte timeout.

        Args:
            now: Monotonic seconds (the same clock as :meth:`feed`'s ``now``).

        Returns:
            A ``stale_partial`` error when a partial line was discarded, else None.

        >>> p = LineParser(["a"], inter_byte_timeout_s=2.0)
        >>> p.feed(b"1.", now=10.0), p.expire(11.0)
        ([], None)
        >>> p.expire(12.5).reason, [r.values.tolist() for r in p.feed(b"5\\n", now=40.0)]
        ('stale_partial', [[5.0]])
        """
        limit, last = self.inter_byte_timeout_s, self._last_byte
        if limit is None or last is None or now - last <= limit:
            return None
        size = len(self._buffer)
        self._buffer.clear()
        self._last_byte = None
        if size == 0:  # the tail of a too-long line: already counted
            return None
        return RecordError(
            f"partial line of {size} byte(s) discarded: no byte for {now - last:.1f} s "
            f"(inter_byte_timeout_s {limit:g})", reason="stale_partial",
        )

    def feed(self, data: bytes, now: float | None = None) -> list[ParsedLine | RecordError]:
        """Add bytes from the port; return the lines they complete, parsed or rejected, in order.

        The buffer never holds more than ``max_line_bytes + 1`` bytes between calls.

        Args:
            data: Bytes as read.
            now: Monotonic receive time in seconds; with ``inter_byte_timeout_s``, a partial
                line older than the timeout is discarded first (a ``stale_partial`` error).
        """
        out: list[ParsedLine | RecordError] = []
        if now is not None:
            stale = self.expire(now)
            if stale is not None:
                out.append(stale)
            self._last_byte = now
        buf = self._buffer
        buf += data
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            if self._discarding:
                self._discarding = False  # the tail of a line already rejected as too long
            else:
                line = bytes(buf[start:end])
                if line.endswith(b"\r"):
                    line = line[:-1]
                if len(line) > self.max_line_bytes:
                    out.append(self._too_long(len(line)))
                else:
                    try:
                        parsed = self.parse_line(line)
                    except RecordError as exc:
                        out.append(exc)
                    else:
                        if parsed is not None:
                            out.append(parsed)
            start = end + 1
        del buf[:start]
        # +1: a line of exactly max_line_bytes may still be waiting for the \n of its \r\n.
        if len(buf) > self.max_line_bytes + 1:
            if not self._discarding:
                out.append(self._too_long(len(buf)))
                self._discarding = True
            buf.clear()
        return out

    def _too_long(self, size: int) -> RecordError:
        return RecordError(
            f"line longer than {self.max_line_bytes} bytes ({size} so far)", reason="too_long"
        )

    def parse_line(self, line: bytes) -> ParsedLine | None:
        """Parse one line without its terminator.

        Returns:
            The parsed line, or None for a blank line.

        Raises:
            RecordError: With a ``reason`` from the module docstring.
        """
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise RecordError(f"line is not UTF-8: {line[:32]!r}", reason="not_utf8") from exc
        if not text:
            return None
        if self.fmt == "kv":
            return self._parse_kv(text)
        return self._parse_csv(text)

    def _parse_csv(self, text: str) -> ParsedLine:
        fields = text.split(self.delimiter)
        expected = len(self.channels) + (1 if self.timestamp_field else 0)
        if len(fields) != expected:
            raise RecordError(
                f"line has {len(fields)} fields, expected {expected}: {text[:64]!r}",
                reason="field_count",
            )
        ts = _timestamp(fields[0]) if self.timestamp_field else None
        return ParsedLine(ts, _values(fields[-len(self.channels) :], text))

    def _parse_kv(self, text: str) -> ParsedLine:
        pairs: dict[str, str] = {}
        for token in _KV_SPLIT.split(text):
            if not token:
                continue
            key, sep, value = token.partition("=")
            if not sep:
                raise RecordError(f"token {token[:32]!r} is not key=value", reason="non_numeric")
            pairs[key] = value
        missing = [c for c in self.channels if c not in pairs]
        if missing:
            raise RecordError(f"line lacks channel(s) {missing}", reason="missing_channel")
        ts: float | None = None
        if self.timestamp_field:
            if "ts" not in pairs:
                raise RecordError("line lacks the 'ts' key", reason="bad_timestamp")
            ts = _timestamp(pairs["ts"])
        return ParsedLine(ts, _values([pairs[c] for c in self.channels], text))


def _timestamp(field: str) -> float:
    try:
        ts = float(field)
    except ValueError:
        raise RecordError(f"bad timestamp {field[:32]!r}", reason="bad_timestamp") from None
    if not math.isfinite(ts):
        raise RecordError(f"non-finite timestamp {field[:32]!r}", reason="bad_timestamp")
    return ts


def _values(fields: list[str], text: str) -> FloatArray:
    try:
        values = np.array([float(f) for f in fields], dtype=np.float64)
    except ValueError:
        raise RecordError(f"non-numeric value in {text[:64]!r}", reason="non_numeric") from None
    if not np.isfinite(values).all():
        raise RecordError(f"non-finite value in {text[:64]!r}", reason="non_finite")
    return values
