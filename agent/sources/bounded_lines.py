"""Lines of a text file with a bound on their length, for :mod:`csv` readers of recordings.

A recording may hold a line of hundreds of megabytes (a binary blob, a dump without newlines).
Iterating a file object, or ``csv.reader`` over it, reads each line whole before anything can
refuse it. :class:`BoundedLines` hands out lines of at most ``max_chars`` characters and skips an
over-long one in chunks of ``chunk_chars``, so memory stays at ``max_chars + chunk_chars``
characters whatever the file holds; the skipped line is raised as a
:class:`agent.errors.RecordError` (``reason = "too_long"``). ``csv.reader`` passes that
exception through and starts a fresh record on its next call, so the caller rejects the row and
reads on.
"""

from __future__ import annotations

from typing import TextIO

from agent.errors import RecordError

_TERMINATORS = ("\n", "\r")


class BoundedLines:
    """Iterator over the lines of a text file opened with ``newline=""``, none over a bound.

    Args:
        file: The open text file (``newline=""``: ``\\n``, ``\\r\\n`` and ``\\r`` end lines and
            are kept, as :mod:`csv` needs them).
        max_chars: Longest line or record accepted, in characters, terminator excluded.
        chunk_chars: Characters read at a time while skipping an over-long line.

    Attributes:
        line_num: Physical lines consumed so far, skipped ones included (1-based number of the
            last line handed out or skipped).

    Raises:
        RecordError: From ``next()``, ``reason = "too_long"`` with ``line`` (its number) when a
            line, or a record that :meth:`start_record` began (a quoted field over several
            lines), is longer than ``max_chars``; the over-long line has then been consumed
            to its end.
        OSError: When reading the file fails.

    >>> import io
    >>> text = "a,b\\r\\n" + "x" * 50 + "\\r\\n1,2\\n"
    >>> lines = BoundedLines(io.StringIO(text, newline=""), max_chars=10, chunk_chars=8)
    >>> next(lines)
    'a,b\\r\\n'
    >>> try:
    ...     next(lines)
    ... except RecordError as exc:
    ...     print(exc.reason, exc)
    too_long row of 50 characters skipped: longer than 10 (line=2)
    >>> next(lines), lines.line_num
    ('1,2\\n', 3)
    """

    def __init__(self, file: TextIO, max_chars: int, chunk_chars: int = 65536) -> None:
        if max_chars < 1 or chunk_chars < 1:
            raise ValueError("max_chars and chunk_chars must be positive")
        self._file = file
        self._max = max_chars
        self._chunk = chunk_chars
        self._record_chars: int | None = None  # counting since start_record(), if called
        self._lf_pending = False  # the last skipped piece ended in "\r": a "\n" may follow
        self.line_num = 0

    def __iter__(self) -> BoundedLines:
        return self

    def start_record(self) -> None:
        """Start counting a new record: call it before each ``next(csv_reader)`` to bound a
        record over several lines too (without it, each line is bounded on its own)."""
        self._record_chars = 0

    def __next__(self) -> str:
        # +2: a line of exactly max_chars still fits with its "\r\n".
        line = self._file.readline(self._max + 2)
        if self._lf_pending:
            self._lf_pending = False
            if line == "\n":  # the second half of the skipped line's "\r\n"
                line = self._file.readline(self._max + 2)
        if not line:
            raise StopIteration
        self.line_num += 1
        content = len(line.rstrip("\r\n"))
        whole = line.endswith(_TERMINATORS) or len(line) < self._max + 2  # else: more to come
        record = content if self._record_chars is None else self._record_chars + content
        if content <= self._max and whole and record <= self._max:
            if self._record_chars is not None:
                self._record_chars = record
            return line
        if whole:
            self._lf_pending = line.endswith("\r")  # cut between "\r" and "\n"?
            total = record
        else:
            total = record + self._skip_rest()
        if self._record_chars is not None:
            self._record_chars = 0
        raise RecordError(
            f"row of {total} characters skipped: longer than {self._max}",
            reason="too_long",
            line=self.line_num,
        )

    def _skip_rest(self) -> int:
        """Consume the rest of the current line in chunks; return the characters consumed."""
        skipped = 0
        while True:
            piece = self._file.readline(self._chunk)
            if not piece:
                return skipped  # the file ended inside the line
            skipped += len(piece.rstrip("\r\n"))
            if piece.endswith(_TERMINATORS):
                self._lf_pending = piece.endswith("\r")
                return skipped
