"""Agent-side HTTP client of the fleet: upload one ingest batch per call.

``POST <base_url>/v1/ingest`` with the batch as JSON (field aliases, so ``schema`` not
``schema_``), gzip-compressed, ``Content-Encoding: gzip``, ``Content-Type: application/json`` and
``Authorization: Bearer <device token>`` (see :mod:`cloud_sync.protocol`). ONE attempt per call:
the retry loop, backoff and bandwidth budget live in the caller (the agent's uploader), which
also decides what a failure means for the stored records.

Timeouts: ``(connect_timeout_s, read_timeout_s)`` go to ``requests``; the read timeout bounds
each wait for the server's bytes, so a server that accepts the connection and never answers
fails after ``read_timeout_s``. The response body is read in chunks against an overall deadline
of ``connect_timeout_s + 2 * read_timeout_s``, so a server trickling its body byte by byte
cannot hold the call much longer either.

Errors (tree in :mod:`cloud_sync.errors`): connection errors, timeouts, 429, 503 and any other
5xx raise :class:`FleetUnavailable` (with ``retry_after_s`` from ``Retry-After``, given as
delta-seconds or an HTTP-date, RFC 9110 section 10.2.3); 401/403 raise :class:`FleetAuthError`;
other 4xx :class:`FleetRejected`; a 200 whose body is not an :class:`IngestResult` covering
every record index exactly once raises :class:`FleetProtocolError`. The token never appears in
a message.
"""

from __future__ import annotations

import datetime
import email.utils
import gzip
import json
import math
import time
from collections.abc import Callable

import requests
from pydantic import ValidationError

from cloud_sync.errors import (
    FleetAuthError,
    FleetProtocolError,
    FleetRejected,
    FleetUnavailable,
)
from cloud_sync.protocol import IngestBatch, IngestResult

INGEST_PATH = "/v1/ingest"
#: Largest response body read, bytes (a result for 5,000 records is ~300 kB).
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
_CHUNK = 64 * 1024
_DETAIL_CHARS = 300


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Parse a ``Retry-After`` header into seconds from ``now`` (never negative).

    Args:
        value: The header value: delta-seconds (``"120"``) or an HTTP-date
            (``"Wed, 21 Oct 2015 07:28:00 GMT"``); None when absent.
        now: Current wall-clock time, epoch seconds UTC (for the HTTP-date form).

    Returns:
        Seconds to wait, or None when the header is absent or unparseable.

    >>> parse_retry_after("7", 0.0)
    7.0
    >>> parse_retry_after("Thu, 01 Jan 1970 00:00:30 GMT", 10.0)
    20.0
    >>> parse_retry_after("soon", 0.0) is None
    True
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000": RFC 9110 dates are GMT anyway
            when = when.replace(tzinfo=datetime.UTC)
        return max(0.0, when.timestamp() - now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def check_result(result: IngestResult, n_records: int) -> None:
    """Check that ``result`` names every index ``0..n_records-1`` exactly once.

    Raises:
        FleetProtocolError: An index is missing, repeated or out of range.
    """
    seen = [0] * n_records
    for item in result.results:
        if item.index >= n_records:
            raise FleetProtocolError(
                f"ingest result names index {item.index} of a {n_records}-record batch"
            )
        seen[item.index] += 1
    bad = [i for i, c in enumerate(seen) if c != 1]
    if bad:
        raise FleetProtocolError(
            f"ingest result covers {len(bad)} of {n_records} indexes not exactly once "
            f"(first: {bad[0]})"
        )


class FleetClient:
    """One device's connection to the fleet's ingest endpoint.

    Args:
        base_url: Fleet root, e.g. ``https://fleet.example:8443`` (a trailing ``/`` is fine).
        token: The device token (from ``edge-fleet device add``); sent as a Bearer token.
        session: HTTP session (connection pooling; tests pass their own); None = a new one.
        connect_timeout_s: Seconds to wait for the TCP/TLS connection.
        read_timeout_s: Seconds to wait for each read of the response (see module docstring).
        clock: Wall clock, epoch seconds UTC (``sent_at`` stamps, HTTP-date Retry-After).
        gzip_level: zlib compression level 1 (fast) .. 9 (small).
        monotonic: Monotonic clock for the response deadline.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        session: requests.Session | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        *,
        gzip_level: int = 6,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= gzip_level <= 9:
            raise ValueError(f"gzip_level must be 1..9, got {gzip_level}")
        if connect_timeout_s <= 0 or read_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self.url = base_url.rstrip("/") + INGEST_PATH
        self._token = token
        self._session = session if session is not None else requests.Session()
        self._owns_session = session is None
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.clock = clock
        self.gzip_level = gzip_level
        self._monotonic = monotonic

    def encode(self, batch: IngestBatch) -> bytes:
        """Return the gzip-compressed JSON body of ``batch`` (what :meth:`send` posts)."""
        raw = batch.model_dump_json(by_alias=True).encode("utf-8")
        return gzip.compress(raw, compresslevel=self.gzip_level, mtime=0)

    def ingest(self, batch: IngestBatch) -> IngestResult:
        """Upload one batch (one HTTP attempt).

        Returns:
            The fleet's verdict, one result per record index (checked).

        Raises:
            FleetUnavailable: Connection failed, timed out, or HTTP 429/5xx.
            FleetAuthError: HTTP 401/403.
            FleetRejected: Any other 4xx.
            FleetProtocolError: A 200 whose body breaks the contract.
        """
        return self.send(self.encode(batch), len(batch.records))

    def send(self, body: bytes, n_records: int) -> IngestResult:
        """Post an already encoded batch (see :meth:`encode`); same contract as :meth:`ingest`.

        Args:
            body: gzip-compressed JSON of an :class:`IngestBatch`.
            n_records: How many records that batch holds (to check the result).
        """
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "Accept": "application/json",
        }
        deadline = self._monotonic() + self.connect_timeout_s + 2 * self.read_timeout_s
        try:
            resp = self._session.post(
                self.url,
                data=body,
                headers=headers,
                timeout=(self.connect_timeout_s, self.read_timeout_s),
                stream=True,
                allow_redirects=False,
            )
        except requests.Timeout as exc:
            raise FleetUnavailable(f"fleet timed out: {type(exc).__name__}") from exc
        except requests.RequestException as exc:
            raise FleetUnavailable(f"fleet unreachable: {_short(exc)}") from exc
        try:
            content = self._read_body(resp, deadline)
        finally:
            resp.close()
        status = resp.status_code
        if status == 200:
            return self._parse_result(content, n_records)
        detail = _detail(content)
        if status in (429, 503) or status >= 500:
            retry_after = parse_retry_after(resp.headers.get("Retry-After"), self.clock())
            raise FleetUnavailable(
                f"fleet answered HTTP {status}: {detail}", retry_after_s=retry_after, status=status
            )
        if status in (401, 403):
            raise FleetAuthError(status, detail)
        if 400 <= status < 500:
            raise FleetRejected(status, detail)
        raise FleetProtocolError(f"unexpected HTTP {status} from the ingest endpoint: {detail}")

    def _read_body(self, resp: requests.Response, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in resp.iter_content(_CHUNK):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise FleetProtocolError(f"response larger than {MAX_RESPONSE_BYTES} bytes")
                if self._monotonic() > deadline:
                    raise FleetUnavailable("fleet response too slow (deadline passed)")
        except requests.Timeout as exc:
            raise FleetUnavailable(f"fleet timed out reading the response: {exc!r}") from exc
        except requests.RequestException as exc:
            raise FleetUnavailable(f"fleet connection broke: {_short(exc)}") from exc
        return b"".join(chunks)

    @staticmethod
    def _parse_result(content: bytes, n_records: int) -> IngestResult:
        try:
            result = IngestResult.model_validate_json(content)
        except ValidationError as exc:
            raise FleetProtocolError(
                f"200 response is not an IngestResult ({exc.error_count()} problem(s)): "
                f"{_detail(content)}"
            ) from exc
        check_result(result, n_records)
        return result

    def close(self) -> None:
        """Close the session if this client created it."""
        if self._owns_session:
            self._session.close()


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:_DETAIL_CHARS]}"


def _detail(content: bytes) -> str:
    """The server's explanation: JSON ``detail`` when present, else the body's start."""
    text = content[:4096].decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:_DETAIL_CHARS].strip() or "(empty body)"
    if isinstance(parsed, dict) and "detail" in parsed:
        return str(parsed["detail"])[:_DETAIL_CHARS]
    return text[:_DETAIL_CHARS]
