"""Garbage and oversized input: always a clear 4xx JSON error, never a 500."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest
from fastapi.testclient import TestClient

from cloud_sync.protocol import MAX_BATCH_RECORDS, MAX_BODY_BYTES
from tests.fleet.wire import aggregate, batch, bearer, gz

JSON_CT = {"Content-Type": "application/json"}
GZIP = {**JSON_CT, "Content-Encoding": "gzip"}
_VALID = json.dumps(batch("gw1", [aggregate("gw1")])).encode()


def _bomb() -> bytes:
    """~17 MiB of zeros inflating past MAX_BODY_BYTES from ~17 KiB of gzip."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (1 << 20)
    parts = [comp.compress(zeros) for _ in range(MAX_BODY_BYTES // len(zeros) + 1)]
    return b"".join(parts) + comp.flush()


CASES: list[tuple[str, bytes, dict[str, str], int]] = [
    ("not json", b"hello", JSON_CT, 400),
    ("not utf-8", b"\xff\xfe{}", JSON_CT, 400),
    ("empty", b"", JSON_CT, 400),
    ("says gzip, is not", _VALID, GZIP, 400),
    ("truncated gzip", gzip.compress(_VALID)[:-12], GZIP, 400),
    ("empty gzip", b"", GZIP, 400),
    ("gzip then garbage", gzip.compress(_VALID) + b"junk", GZIP, 400),
    ("gzip of not json", gzip.compress(b"\x00\x01binary"), GZIP, 400),
    ("gzip bomb", _bomb(), GZIP, 413),
    ("deflate encoding", zlib.compress(_VALID), {**JSON_CT, "Content-Encoding": "br"}, 415),
    ("text/plain", _VALID, {"Content-Type": "text/plain"}, 415),
    ("json array", b"[1, 2, 3]", JSON_CT, 422),
    ("json string", b'"batch"', JSON_CT, 422),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, JSON_CT, 400),
    ("records not a list", json.dumps(batch("gw1", {"a": 1})).encode(), JSON_CT, 422),  # type: ignore[arg-type]
    ("wrong types", json.dumps(batch("gw1", [], sent_at="soon")).encode(), JSON_CT, 422),
    ("negative backlog",
     json.dumps(batch("gw1", [], backlog={"alerts": -1, "aggregates": 0})).encode(), JSON_CT, 422),
    ("huge backlog",
     json.dumps(batch("gw1", [], backlog={"alerts": 2**80, "aggregates": 0})).encode(),
     JSON_CT, 422),
    ("NaN sent_at", json.dumps(batch("gw1", [])).replace('"sent_at": 1700000100.0',
                                                         '"sent_at": NaN').encode(), JSON_CT, 422),
    ("missing backlog", json.dumps({"device_id": "gw1", "sent_at": 1, "records": []}).encode(),
     JSON_CT, 422),
    ("unknown schema", json.dumps(batch("gw1", [], schema=99)).encode(), JSON_CT, 422),
    ("NUL in agent_version", json.dumps(batch("gw1", [], agent_version="a\x00")).encode(),
     JSON_CT, 422),
    ("too many records",
     json.dumps(batch("gw1", [1] * (MAX_BATCH_RECORDS + 1))).encode(), JSON_CT, 413),
]


@pytest.mark.parametrize(("name", "body", "headers", "status"), CASES, ids=[c[0] for c in CASES])
def test_garbage_bodies_get_a_clear_4xx(
    client: TestClient, enrolled: dict[str, str], name: str, body: bytes,
    headers: dict[str, str], status: int,
) -> None:
    resp = client.post("/v1/ingest", content=body, headers={**headers, **bearer(enrolled["gw1"])})
    assert resp.status_code == status, (name, resp.text[:300])
    doc = resp.json()
    assert set(doc) == {"error", "detail"} and doc["error"]


def test_content_length_over_limit_is_413_before_reading(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    big = b"x" * (MAX_BODY_BYTES + 1)
    resp = client.post("/v1/ingest", content=big, headers={**JSON_CT, **bearer(enrolled["gw1"])})
    assert resp.status_code == 413
    assert resp.json()["error"] == "payload_too_large"


def test_unauthenticated_garbage_is_401_not_parsed(client: TestClient) -> None:
    resp = client.post("/v1/ingest", content=b"\x1f\x8bjunk", headers=GZIP)
    assert resp.status_code == 401


def test_full_batch_gzip_is_accepted(client: TestClient, enrolled: dict[str, str]) -> None:
    records = [aggregate("gw1", t=1_700_000_000 + 60 * i) for i in range(MAX_BATCH_RECORDS)]
    resp = client.post("/v1/ingest", content=gz(batch("gw1", records)),
                       headers={**GZIP, **bearer(enrolled["gw1"])})
    assert resp.status_code == 200
    assert {r["status"] for r in resp.json()["results"]} == {"accepted"}


def test_unknown_route_and_method_are_json(client: TestClient) -> None:
    missing = client.get("/v2/nothing")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    wrong = client.put("/v1/ingest")
    assert wrong.status_code == 405 and wrong.json()["error"] == "http_405"
