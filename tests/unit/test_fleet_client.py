"""FleetClient against real local HTTP servers (http.server in a thread, raw sockets)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from cloud_sync.client import FleetClient, parse_retry_after
from cloud_sync.errors import (
    FleetAuthError,
    FleetProtocolError,
    FleetRejected,
    FleetUnavailable,
)
from cloud_sync.protocol import (
    AggregateBody,
    AggregateRecord,
    Backlog,
    IngestBatch,
    SampleBatch,
)

Reply = tuple[int, dict[str, str], bytes]


class Recorder:
    """What the server saw, and what it answers next."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.reply: Callable[[dict[str, Any]], Reply] = ok_reply


def ok_reply(batch: dict[str, Any]) -> Reply:
    results = [{"index": i, "status": "accepted"} for i in range(len(batch["records"]))]
    return 200, {"Content-Type": "application/json"}, json.dumps({"results": results}).encode()


@pytest.fixture
def server() -> Iterator[tuple[str, Recorder]]:
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            rec.requests.append((self.path, dict(self.headers.items()), body))
            try:
                batch = json.loads(gzip.decompress(body))
            except (OSError, ValueError):
                batch = {"records": []}
            status, headers, payload = rec.reply(batch)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", rec
    finally:
        httpd.shutdown()
        httpd.server_close()


def batch(n: int = 3) -> IngestBatch:
    records = [
        AggregateRecord(
            kind="aggregate",
            id=f"gw1:pump1:{i * 60_000}",
            body=AggregateBody(
                device_id="gw1", stream="pump1", interval_start=i * 60.0, interval_s=60.0,
                count=10, channels=[], max_score=None, windows=1, alert_count=0,
            ),
        )
        for i in range(n)
    ]
    return IngestBatch(device_id="gw1", sent_at=1.0, backlog=Backlog(alerts=0, aggregates=n),
                       records=records)  # type: ignore[arg-type]


def test_posts_gzip_json_with_headers(server: tuple[str, Recorder]) -> None:
    url, rec = server
    client = FleetClient(url + "/", "sekrit")
    result = client.ingest(batch(3))
    assert [r.status for r in result.results] == ["accepted"] * 3
    path, headers, body = rec.requests[0]
    assert path == "/v1/ingest"
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"] == "application/json"
    assert headers["Authorization"] == "Bearer sekrit"
    sent = json.loads(gzip.decompress(body))
    assert sent["schema"] == 1 and "schema_" not in sent
    assert sent["records"][1]["id"] == "gw1:pump1:60000"
    assert sent["records"][0]["body"]["max_score"] is None


def test_429_with_retry_after_seconds(server: tuple[str, Recorder]) -> None:
    url, rec = server
    rec.reply = lambda b: (429, {"Retry-After": "17"}, b'{"detail":"slow down"}')
    with pytest.raises(FleetUnavailable) as info:
        FleetClient(url, "t").ingest(batch())
    assert info.value.retry_after_s == 17.0
    assert info.value.status == 429
    assert "slow down" in str(info.value)


def test_503_with_retry_after_http_date(server: tuple[str, Recorder]) -> None:
    url, rec = server
    rec.reply = lambda b: (503, {"Retry-After": "Thu, 01 Jan 1970 00:01:40 GMT"}, b"")
    with pytest.raises(FleetUnavailable) as info:
        FleetClient(url, "t", clock=lambda: 40.0).ingest(batch())
    assert info.value.retry_after_s == pytest.approx(60.0)


def test_500_is_unavailable_without_retry_after(server: tuple[str, Recorder]) -> None:
    url, rec = server
    rec.reply = lambda b: (500, {}, b"Internal Server Error")
    with pytest.raises(FleetUnavailable) as info:
        FleetClient(url, "t").ingest(batch())
    assert info.value.retry_after_s is None and info.value.status == 500


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors(server: tuple[str, Recorder], status: int) -> None:
    url, rec = server
    rec.reply = lambda b: (status, {}, b'{"detail":"unknown token"}')
    with pytest.raises(FleetAuthError) as info:
        FleetClient(url, "t").ingest(batch())
    assert info.value.status == status and info.value.detail == "unknown token"
    assert info.value.retryable


def test_other_4xx_is_rejected(server: tuple[str, Recorder]) -> None:
    url, rec = server
    rec.reply = lambda b: (422, {}, b'{"detail":"bad record"}')
    with pytest.raises(FleetRejected) as info:
        FleetClient(url, "t").ingest(batch())
    assert not isinstance(info.value, FleetAuthError)
    assert info.value.status == 422 and not info.value.retryable


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b'{"results": "nope"}',
        b'{"results": [{"index": 0, "status": "accepted"}]}',  # indexes 1, 2 missing
        b'{"results": [{"index": 0, "status": "accepted"}, {"index": 0, "status": "accepted"},'
        b' {"index": 1, "status": "accepted"}]}',  # 0 twice, 2 missing
        b'{"results": [{"index": 0, "status": "ok"}, {"index": 1, "status": "accepted"},'
        b' {"index": 2, "status": "accepted"}]}',  # unknown status
    ],
)
def test_malformed_200_is_a_protocol_error(server: tuple[str, Recorder], payload: bytes) -> None:
    url, rec = server
    rec.reply = lambda b: (200, {}, payload)
    with pytest.raises(FleetProtocolError):
        FleetClient(url, "t").ingest(batch(3))


DEEP = b"[" * 5_000  # deeper than the stdlib JSON parser's recursion limit


@pytest.mark.parametrize(("status", "error"), [(500, FleetUnavailable), (403, FleetAuthError),
                                               (422, FleetRejected)])
def test_deeply_nested_error_body_is_the_status_error(
    server: tuple[str, Recorder], status: int, error: type[Exception]
) -> None:
    # json.loads of the error's detail raised RecursionError, which killed the uploader thread
    url, rec = server
    rec.reply = lambda b: (status, {"Content-Type": "application/json"}, DEEP)
    with pytest.raises(error, match=r"\[\[\["):
        FleetClient(url, "t").ingest(batch())


def test_deeply_nested_samples_answer_is_a_protocol_error(server: tuple[str, Recorder]) -> None:
    url, rec = server
    rec.reply = lambda b: (200, {"Content-Type": "application/json"}, DEEP)
    samples = SampleBatch(device_id="gw1", stream="pump1", channels=["a"], config_hash="h",
                          windows=[[[1.0]]])
    with pytest.raises(FleetProtocolError):
        FleetClient(url, "t").post_samples(samples)


def test_connection_refused_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(FleetUnavailable) as info:
        FleetClient(f"http://127.0.0.1:{port}", "t", connect_timeout_s=1).ingest(batch())
    assert info.value.retry_after_s is None and info.value.status is None


def test_server_that_accepts_and_never_answers_is_bounded_by_read_timeout() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_sleep() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)  # read nothing, answer nothing

    t = threading.Thread(target=accept_and_sleep, daemon=True)
    t.start()
    try:
        client = FleetClient(f"http://127.0.0.1:{port}", "t", connect_timeout_s=1,
                             read_timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(FleetUnavailable, match="timed out"):
            client.ingest(batch())
        assert time.monotonic() - t0 < 0.5 + 1.0
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        listener.close()


def test_parse_retry_after_edge_cases() -> None:
    assert parse_retry_after(None, 0.0) is None
    assert parse_retry_after("-5", 0.0) == 0.0
    assert parse_retry_after("nan", 0.0) is None
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", 100.0) == 0.0
