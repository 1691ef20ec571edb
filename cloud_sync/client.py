"""Agent-side HTTP client of the fleet: upload one ingest batch per call.

``POST <base_url>/v1/ingest`` with the batch as JSON (field aliases, so ``schema`` not
``schema_``), gzip-compressed, ``Content-Encoding: gzip``, ``Content-Type: application/json`` and
``Authorization: Bearer <device token>`` (see :mod:`cloud_sync.protocol`). ONE attempt per call:
the retry loop, backoff and bandwidth budget live in the caller (the agent's uploader), which
also decides what a failure means for the stored records.

Timeouts: ``(connect_timeout_s, read_timeout_s)`` go to ``requests``; the read timeout bounds
each wait for the server's bytes, so a server that accepts the connection and never answers
fails after ``read_timeout_s``. Every call also has a TOTAL deadline,
``total_timeout_s = connect_timeout_s + 2 * read_timeout_s``, plus the bytes sent or downloaded
over ``min_bytes_per_s`` (a large batch on a slow link still fits): when it passes, the
call's sockets are shut down (:mod:`cloud_sync.deadline`) and it raises
:class:`FleetDeadlineExceeded`, so a server that trickles its headers or body one byte per
second cannot hold it longer. :meth:`FleetClient.abort`
cuts every call in progress short the same way (the agent is stopping).

Errors (tree in :mod:`cloud_sync.errors`): connection errors, timeouts, 429, 503 and any other
5xx raise :class:`FleetUnavailable` (with ``retry_after_s`` from ``Retry-After``, given as
delta-seconds or an HTTP-date, RFC 9110 section 10.2.3); 401/403 raise :class:`FleetAuthError`;
other 4xx :class:`FleetRejected`; a 200 whose body is not an :class:`IngestResult` covering
every record index exactly once raises :class:`FleetProtocolError`. The token never appears in
a message.

Model loop (same token, same error mapping; :mod:`cloud_sync.protocol`):
:meth:`FleetClient.assignment` (``GET /v1/models/assignment``: 204 = nothing assigned),
:meth:`FleetClient.download` (resumable: the bytes go to ``<dest>.part``; a retry sends
``Range: bytes=<have>-`` and appends on a 206 whose ``Content-Range`` starts at ``have``, starts
over on a 200 (range ignored) or a 416; size and sha256 are checked before the atomic rename) and
:meth:`FleetClient.report_status` (``POST /v1/models/status``).
"""

from __future__ import annotations

import datetime
import email.utils
import gzip
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import quote

import requests
import urllib3
from pydantic import ValidationError

from cloud_sync.deadline import Deadlines, bounded, install
from cloud_sync.errors import (
    AssignmentInvalid,
    FleetAuthError,
    FleetDeadlineExceeded,
    FleetDownloadShort,
    FleetProtocolError,
    FleetRejected,
    FleetUnavailable,
)
from cloud_sync.health import HEALTH_PATH, HealthSummary
from cloud_sync.protocol import (
    SNAPSHOT_KINDS,
    IngestBatch,
    IngestResult,
    ModelAssignment,
    ModelStatusReport,
    SampleBatch,
)

INGEST_PATH = "/v1/ingest"
ASSIGNMENT_PATH = "/v1/models/assignment"
STATUS_PATH = "/v1/models/status"
SAMPLES_PATH = "/v1/samples"
#: Progress callback of :meth:`FleetClient.download`: (bytes on disk, expected size).
Progress = Callable[[int, int], None]
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
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
            when = when.replace(tzinfo=datetime.timezone.utc)
        return max(0.0, when.timestamp() - now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def batch_json(header: IngestBatch, records: Sequence[str]) -> bytes:
    """The JSON of ``header`` with ``records`` (each already a record's JSON text) as its records.

    The fast way to encode a large batch: the header (everything but the records) is a validated
    :class:`IngestBatch` with no records; the records are spliced in as text, never parsed or
    re-validated here (the fleet validates every record and rejects bad ones by index).

    Args:
        header: The batch without records (``records == []``).
        records: One JSON object text per record (``{"kind":...,"id":...,"body":{...}}``).

    Returns:
        UTF-8 JSON bytes.

    Raises:
        ValueError: ``header`` already holds records.

    >>> h = IngestBatch(device_id="gw1", sent_at=1.0, backlog={"alerts": 0, "aggregates": 0},
    ...                 records=[])
    >>> batch_json(h, ['{"a":1}', '{"b":2}']).endswith(b'"records":[{"a":1},{"b":2}]}')
    True
    """
    if header.records:
        raise ValueError("batch_json: the header must not hold records")
    # ``aggregates`` (schema 2) is left out when unset: a schema-1 fleet forbids unknown keys.
    head = header.model_dump_json(
        by_alias=True, exclude={"aggregates"} if header.aggregates is None else None
    )
    tail = '"records":[]}'
    if not head.endswith(tail):  # records is the last field of IngestBatch
        raise ValueError("batch_json: unexpected header layout")
    return (head[: -len(tail)] + '"records":[' + ",".join(records) + "]}").encode("utf-8")


def columns_batch_json(
    header: IngestBatch, records: Sequence[str], aggregates: str | None
) -> bytes:
    """A schema-2 batch: ``header``, ``records`` spliced in as :func:`batch_json` does, and the
    aggregates as columns (``aggregates``: the JSON text of an
    :class:`~cloud_sync.protocol.AggregateColumns`, e.g. from
    :func:`agent.store.wire.aggregate_columns`; None for none).

    Record indexes: ``records`` first, then the columns (see :mod:`cloud_sync.protocol`).

    Returns:
        UTF-8 JSON bytes.

    Raises:
        ValueError: ``header`` is not schema 2, or already holds records or aggregates.

    >>> h = IngestBatch(schema=2, device_id="gw1", sent_at=1.0,
    ...                 backlog={"alerts": 0, "aggregates": 0}, records=[])
    >>> columns_batch_json(h, ['{"a":1}'], '{"ids":[]}').endswith(
    ...     b',"records":[{"a":1}],"aggregates":{"ids":[]}}')
    True
    """
    if header.schema_ < 2 or header.records or header.aggregates is not None:
        raise ValueError("columns_batch_json: a schema-2/3 header without records or "
                         "aggregates")
    head = header.model_dump_json(by_alias=True, exclude={"records", "aggregates"})
    parts = [head[:-1], ',"records":[', ",".join(records), "]"]
    if aggregates is not None:
        parts += [',"aggregates":', aggregates]
    parts.append("}")
    return "".join(parts).encode("utf-8")


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
        min_bytes_per_s: Slowest transfer rate the total deadline allows for: an upload body's
            or a download's size over it is added to ``total_timeout_s`` (bytes per second).
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
        min_bytes_per_s: float = 64 * 1024,
    ) -> None:
        if not 1 <= gzip_level <= 9:
            raise ValueError(f"gzip_level must be 1..9, got {gzip_level}")
        if connect_timeout_s <= 0 or read_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + INGEST_PATH
        self._token = token
        self._session = session if session is not None else requests.Session()
        self._owns_session = session is None
        install(self._session)
        self._deadlines = Deadlines()
        self.min_bytes_per_s = min_bytes_per_s
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.clock = clock
        self.gzip_level = gzip_level
        self._monotonic = monotonic

    @property
    def total_timeout_s(self) -> float:
        """The total deadline of one call (a download adds its size's share), seconds."""
        return self.connect_timeout_s + 2 * self.read_timeout_s

    def abort(self) -> int:
        """Cut every call in progress short, and every later one (the agent is stopping).

        Returns:
            How many calls were in progress.
        """
        return self._deadlines.abort_all()

    def encode(self, batch: IngestBatch) -> bytes:
        """Return the gzip-compressed JSON body of ``batch`` (what :meth:`send` posts)."""
        exclude = {"aggregates"} if batch.aggregates is None else None  # see batch_json
        return self.compress(batch.model_dump_json(by_alias=True, exclude=exclude).encode())

    def compress(self, document: bytes) -> bytes:
        """gzip ``document`` (JSON of an :class:`IngestBatch`, e.g. from :func:`batch_json`)."""
        return gzip.compress(document, compresslevel=self.gzip_level, mtime=0)

    def ingest(self, batch: IngestBatch) -> IngestResult:
        """Upload one batch (one HTTP attempt).

        Returns:
            The fleet's verdict, one result per record index (checked).

        Raises:
            FleetUnavailable: Connection failed, timed out, or HTTP 429/5xx;
                :class:`FleetDeadlineExceeded` when the total deadline passed.
            FleetAuthError: HTTP 401/403.
            FleetRejected: Any other 4xx.
            FleetProtocolError: A 200 whose body breaks the contract.
        """
        columns = 0 if batch.aggregates is None else len(batch.aggregates.ids)
        return self.send(self.encode(batch), len(batch.records) + columns)

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
        total = self.total_timeout_s + len(body) / self.min_bytes_per_s
        with bounded(self._deadlines, "upload", total):
            status, content, retry = self._post_ingest(body, headers, total)
        if status == 200:
            return self._parse_result(content, n_records)
        detail = _detail(content)
        if status in (429, 503) or status >= 500:
            retry_after = parse_retry_after(retry, self.clock())
            raise FleetUnavailable(
                f"fleet answered HTTP {status}: {detail}", retry_after_s=retry_after, status=status
            )
        if status in (401, 403):
            raise FleetAuthError(status, detail)
        if 400 <= status < 500:
            raise FleetRejected(status, detail)
        raise FleetProtocolError(f"unexpected HTTP {status} from the ingest endpoint: {detail}")

    def _post_ingest(
        self, body: bytes, headers: dict[str, str], total_s: float
    ) -> tuple[int, bytes, str | None]:
        """(status, body, Retry-After) of one ingest POST within ``total_s``."""
        deadline = self._monotonic() + total_s
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
        return resp.status_code, content, resp.headers.get("Retry-After")

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
                    raise FleetDeadlineExceeded(
                        f"fleet response too slow (total deadline of {self.total_timeout_s:.0f} "
                        "s passed)", deadline_s=self.total_timeout_s,
                    )
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

    # -- model loop -------------------------------------------------------------------------------

    def _headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}", **extra}

    def _request(self, method: str, path: str, **kwargs: object) -> requests.Response:
        """One request to ``base_url + path``; the caller closes the (streamed) response."""
        try:
            return self._session.request(
                method, self.base_url + path,
                timeout=(self.connect_timeout_s, self.read_timeout_s),
                allow_redirects=False, stream=True, **kwargs,  # type: ignore[arg-type]
            )
        except requests.Timeout as exc:
            raise FleetUnavailable(f"fleet timed out: {type(exc).__name__}") from exc
        except requests.RequestException as exc:
            raise FleetUnavailable(f"fleet unreachable: {_short(exc)}") from exc

    def _exchange(
        self, what: str, method: str, path: str, **kwargs: object
    ) -> tuple[requests.Response, bytes]:
        """One request and its whole (bounded) body under the total deadline; the response
        is closed (its status and headers stay readable)."""
        with bounded(self._deadlines, what, self.total_timeout_s):
            deadline = self._monotonic() + self.total_timeout_s
            resp = self._request(method, path, **kwargs)
            try:
                content = self._read_body(resp, deadline)
            finally:
                resp.close()
        return resp, content

    def _raise_for(self, resp: requests.Response, content: bytes, what: str) -> None:
        """Raise the typed error of a non-2xx answer (same mapping as :meth:`send`)."""
        status = resp.status_code
        detail = _detail(content)
        if status == 429 or status >= 500:
            retry_after = parse_retry_after(resp.headers.get("Retry-After"), self.clock())
            raise FleetUnavailable(
                f"fleet answered HTTP {status} to {what}: {detail}", retry_after_s=retry_after,
                status=status,
            )
        if status in (401, 403):
            raise FleetAuthError(status, detail)
        if 400 <= status < 500:
            raise FleetRejected(status, detail)
        raise FleetProtocolError(f"unexpected HTTP {status} to {what}: {detail}")

    def assignment(self, stream: str) -> ModelAssignment | None:
        """Ask which model this device should run on ``stream`` (one attempt).

        Returns:
            The assignment, or None when the fleet answers 204 (keep the installed model).

        Raises:
            FleetUnavailable, FleetAuthError, FleetRejected: as for :meth:`send`.
            AssignmentInvalid: a 200 whose body is not a :class:`ModelAssignment` (names and
                paths are checked here, before anything is written).
        """
        resp, content = self._exchange(
            "the assignment request", "GET", ASSIGNMENT_PATH, params={"stream": stream},
            headers=self._headers(Accept="application/json"),
        )
        if resp.status_code == 204:
            return None
        if resp.status_code != 200:
            self._raise_for(resp, content, "the assignment request")
        try:
            return ModelAssignment.model_validate_json(content)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(x) for x in e['loc']) or 'body'}: {e['msg']} "
                f"(got {repr(e.get('input'))[:80]})"
                for e in exc.errors()[:5]
            )
            raise AssignmentInvalid(
                f"200 response is not a valid ModelAssignment: {problems}", content
            ) from exc

    def report_status(self, report: ModelStatusReport) -> None:
        """Post one model-update state change (one attempt; 200 or 204 = stored).

        Raises:
            FleetUnavailable, FleetAuthError, FleetRejected, FleetProtocolError: as for
            :meth:`send`.
        """
        resp, content = self._exchange(
            "the status report", "POST", STATUS_PATH,
            data=report.model_dump_json().encode("utf-8"),
            headers=self._headers(**{"Content-Type": "application/json"}),
        )
        if resp.status_code not in (200, 204):
            self._raise_for(resp, content, "the status report")

    def post_health(self, summary: HealthSummary) -> None:
        """Post this device's health summary (one attempt; 204 = stored,
        :mod:`cloud_sync.health`).

        Raises:
            FleetUnavailable, FleetAuthError, FleetProtocolError: as for :meth:`send`.
            FleetRejected: 4xx; 404/405 from a fleet older than the health route.
        """
        resp, content = self._exchange(
            "the health report", "POST", HEALTH_PATH,
            data=summary.model_dump_json().encode("utf-8"),
            headers=self._headers(**{"Content-Type": "application/json"}),
        )
        if resp.status_code not in (200, 204):
            self._raise_for(resp, content, "the health report")

    def post_samples(self, batch: SampleBatch) -> int:
        """Upload retraining samples (one attempt): gzip JSON, like :meth:`ingest`.

        Returns:
            Windows the fleet stored (its ``{"stored": n}`` answer).

        Raises:
            FleetUnavailable, FleetAuthError, FleetRejected: as for :meth:`send` (413 when the
                batch is over the fleet's limits).
            FleetProtocolError: a 200 whose body is not ``{"stored": <int>}``.
        """
        body = gzip.compress(batch.model_dump_json().encode("utf-8"),
                             compresslevel=self.gzip_level, mtime=0)
        resp, content = self._exchange(
            "the samples upload", "POST", SAMPLES_PATH, data=body,
            headers=self._headers(**{"Content-Type": "application/json",
                                     "Content-Encoding": "gzip", "Accept": "application/json"}),
        )
        if resp.status_code != 200:
            self._raise_for(resp, content, "the samples upload")
        try:
            stored = json.loads(content)["stored"]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise FleetProtocolError(f"200 response is not {{'stored': n}}: "
                                     f"{_detail(content)}") from exc
        if not isinstance(stored, int):
            raise FleetProtocolError(f"'stored' is not an integer: {_detail(content)}")
        return stored

    def put_snapshot(self, device_id: str, alert_id: str, kind: str, data: bytes) -> None:
        """Upload one alert's snapshot image (one attempt; 200/201/204 = stored).

        Args:
            device_id: This device's id (the route's ``{device_id}``).
            alert_id: The alert the image belongs to (already acknowledged by ingest).
            kind: ``snapshot`` (JPEG) or ``heatmap`` (PNG): :data:`cloud_sync.protocol.
                SNAPSHOT_KINDS`.
            data: The image bytes.

        Raises:
            ValueError: an unknown ``kind``.
            FleetUnavailable, FleetAuthError, FleetRejected, FleetProtocolError: as for
                :meth:`send` (a fleet without the route: FleetRejected 404 or 405).
        """
        ctype = SNAPSHOT_KINDS.get(kind)
        if ctype is None:
            raise ValueError(f"unknown snapshot kind {kind!r}")
        path = (f"/v1/devices/{quote(device_id, safe='')}/alerts/{quote(alert_id, safe='')}/"
                f"{kind}")
        resp, content = self._exchange(
            f"the {kind} upload", "PUT", path, data=data,
            headers=self._headers(**{"Content-Type": ctype, "Accept": "application/json"}),
        )
        if resp.status_code not in (200, 201, 204):
            self._raise_for(resp, content, f"the {kind} upload")

    def download(
        self,
        url_path: str,
        dest: Path,
        expected_size: int,
        expected_sha256: str,
        progress: Progress | None = None,
    ) -> Path:
        """Download ``url_path`` to ``dest``, resuming a previous partial download.

        Bytes go to ``dest.with_suffix('.part')``. When that file exists, the request carries
        ``Range: bytes=<its size>-`` (RFC 9110 section 14.2); a 206 whose ``Content-Range``
        starts there is appended, a 200 (the server ignored the range) or a 416 starts the file
        over. A broken connection keeps the part file for the next call. At the end the size and
        sha256 are checked and the part file is fsynced and renamed to ``dest`` atomically.

        Args:
            url_path: Path relative to the fleet base URL (``ModelAssignment.url``).
            dest: Final file; its directory must exist.
            expected_size: Bytes (``archive_size``).
            expected_sha256: Hex sha256 (``archive_sha256``).
            progress: Called with (bytes on disk, expected_size) after every chunk.

        Returns:
            ``dest``.

        Raises:
            FleetUnavailable: connection failed or broke (the part file is kept), or HTTP
                429/5xx; :class:`FleetDeadlineExceeded` past ``total_timeout_s`` plus
                ``expected_size / min_bytes_per_s`` (the part file is kept).
            FleetAuthError, FleetRejected: HTTP 401/403, other 4xx.
            FleetProtocolError: a bad ``Content-Range``, more bytes than expected, or a size
                or sha256 mismatch at the end (the part file is deleted: the next call starts
                over).
            OSError: the part file cannot be written (a full or read-only disk); what was
                written is kept.
        """
        part = dest.with_suffix(".part")
        path = url_path if url_path.startswith("/") else "/" + url_path
        total = self.total_timeout_s + expected_size / self.min_bytes_per_s
        with bounded(self._deadlines, "the package download", total):
            self._fetch(path, part, expected_size, progress)
        return self._finish(part, dest, expected_size, expected_sha256)

    def _fetch(
        self, path: str, part: Path, expected_size: int, progress: Progress | None
    ) -> None:
        """The download's request(s) into ``part`` (see :meth:`download`)."""
        for _attempt in range(2):  # the second only after a 200/416 reset
            have = part.stat().st_size if part.exists() else 0
            if have > expected_size:
                part.unlink()
                have = 0
            if have == expected_size:
                break  # complete from an earlier call; check below
            headers = self._headers(**{"Accept-Encoding": "identity"})
            if have:
                headers["Range"] = f"bytes={have}-"
            resp = self._request("GET", path, headers=headers)
            try:
                if resp.status_code == 416 and have:
                    part.unlink()
                    continue
                if resp.status_code not in (200, 206):
                    self._raise_for(resp, resp.raw.read(4096, decode_content=True) or b"",
                                    "the package download")
                start = self._range_start(resp, have, expected_size)
                self._write(resp, part, start, expected_size, progress)
            finally:
                resp.close()
            break

    @staticmethod
    def _range_start(resp: requests.Response, have: int, expected_size: int) -> int:
        if resp.status_code == 200:
            return 0
        m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", "").strip())
        if m is None or int(m.group(1)) != have or (
            m.group(3) != "*" and int(m.group(3)) != expected_size
        ):
            raise FleetProtocolError(
                f"206 with Content-Range {resp.headers.get('Content-Range')!r} does not "
                f"continue at byte {have} of {expected_size}"
            )
        return have

    def _write(
        self, resp: requests.Response, part: Path, start: int, expected_size: int,
        progress: Progress | None,
    ) -> None:
        size = start
        with part.open("r+b" if start and part.exists() else "wb") as fh:
            fh.seek(start)
            fh.truncate()
            try:
                while True:
                    # read1: whatever has arrived, so the bytes before a broken connection are
                    # kept (iter_content would drop a short last chunk with the IncompleteRead)
                    try:
                        chunk = resp.raw.read1(_CHUNK, decode_content=False)
                    except (requests.RequestException, urllib3.exceptions.HTTPError,
                            OSError) as exc:
                        raise FleetDownloadShort(f"package download broke at byte {size} of "
                                                 f"{expected_size}: {_short(exc)}") from exc
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > expected_size:
                        fh.close()
                        part.unlink()
                        raise FleetProtocolError(
                            f"package larger than the announced {expected_size} bytes"
                        )
                    fh.write(chunk)  # an OSError here (a full disk) is the gateway's, as it is
                    if progress is not None:
                        progress(size, expected_size)
            finally:
                if not fh.closed:
                    fh.flush()
                    os.fsync(fh.fileno())

    @staticmethod
    def _finish(part: Path, dest: Path, expected_size: int, expected_sha256: str) -> Path:
        size = part.stat().st_size if part.exists() else 0
        if size < expected_size:
            raise FleetDownloadShort(
                f"package download ended at byte {size} of {expected_size}"
            )
        h = hashlib.sha256()
        with part.open("rb") as fh:
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
                h.update(chunk)
        if h.hexdigest() != expected_sha256:
            part.unlink()
            raise FleetProtocolError(
                f"downloaded package sha256 {h.hexdigest()} != announced {expected_sha256}"
            )
        os.replace(part, dest)
        dir_fd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return dest

    def set_token(self, token: str) -> None:
        """Use ``token`` from the next request on (the device was re-enrolled)."""
        self._token = token

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
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." from a hostile server
        return text[:_DETAIL_CHARS].strip() or "(empty body)"
    if isinstance(parsed, dict) and "detail" in parsed:
        return str(parsed["detail"])[:_DETAIL_CHARS]
    return text[:_DETAIL_CHARS]
