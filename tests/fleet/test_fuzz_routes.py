"""Property-based fuzzing of every route of the fleet's OpenAPI, on SQLite and PostgreSQL.

For each operation the OpenAPI document lists (so a new route is fuzzed without editing this
file), hypothesis sends requests built from the document: path and query parameters drawn from
valid values and hostile ones (NUL, over-long, past int64, negative, NaN text, traversal), a
JSON body that is a valid example with up to three fields replaced by hostile JSON (or random
JSON, or random bytes), gzip or not, and a token of each kind (admin, device, another device,
none, garbage). Whatever it sends, the answer is never a 5xx. The fleet holds an enrolled
device, a pushed package and a rollout, so the requests reach the database.

Cost is bounded: :data:`EXAMPLES` requests per operation and database (about 60 s in all here).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from fleet.app import create_app
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN, enroll
from tests.fleet.model_pkg import archive, make_keys
from tests.fleet.wire import T0, aggregate, alert, batch

#: Requests per operation and database; ``FLEET_FUZZ_EXAMPLES=500`` for a deeper run by hand.
EXAMPLES = int(os.environ.get("FLEET_FUZZ_EXAMPLES", "30"))

_DOC_DB = Path(tempfile.gettempdir()) / "edge-fleet-openapi-never-opened.db"
DOC = create_app(Settings(db_url=f"sqlite:///{_DOC_DB}", admin_token="x")).openapi()
OPERATIONS = [(path, method) for path, item in DOC["paths"].items() for method in item]

HOSTILE_TEXT = [
    "", "\x00", "a\x00b", "x" * 65, "x" * 300, "../../../etc/passwd", "gw1", "skab-wstat", "1",
    "-1", "0", "9" * 25, str(2**63), str(-(2**63) - 1), "NaN", "inf", "%00", "\ud800", "💥",
    "line1", " ", "a b", "1e309",
]
HOSTILE_INTS = [0, -1, 1, 2, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30]

text_values = st.sampled_from(HOSTILE_TEXT) | st.text(max_size=80)
scalars = (
    text_values
    | st.sampled_from(HOSTILE_INTS) | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans() | st.none()
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text_values, inner, max_size=4),
    max_leaves=12,
)


@dataclass
class Fleet:
    client: TestClient
    tokens: dict[str, str]
    rollout_id: int


def examples(rollout_id: int) -> dict[str, dict[str, Any]]:
    """A valid body per request schema name."""
    return {
        "EnrollRequest": {"device_id": "gw9", "tags": ["line1"]},
        "RolloutCreate": {"name": "skab-wstat", "version": 1, "devices": ["gw1"],
                          "canary_percent": 50, "stream": "pump1"},
        "ModelStatusReport": {"device_id": "gw1", "stream": "pump1", "name": "skab-wstat",
                              "version": 1, "rollout_id": rollout_id, "state": "rejected",
                              "reason": "r", "details": {"bytes": 1, "x": "y"}, "at": T0},
        "SampleBatch": {"device_id": "gw1", "stream": "pump1", "channels": ["a", "b"],
                        "model": {"name": "skab-wstat", "version": 1}, "config_hash": "h",
                        "sample_rate_hz": 10.0, "kind": "calibration",
                        "windows": [[[1.0, 2.0], [3.0, 4.0]]]},
        "IngestBatch": batch("gw1", [aggregate("gw1"), alert("gw1")]),
    }


@pytest.fixture(scope="session")
def package_bytes(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path]:
    root = tmp_path_factory.mktemp("fuzz-keys")
    key, trusted = make_keys(root)
    return archive(root, 1, key), trusted


@pytest.fixture
def fleet(
    settings: Settings, engine: Engine, package_bytes: tuple[bytes, Path]
) -> Iterator[Fleet]:
    data, trusted = package_bytes
    s = Settings(**{**settings.__dict__, "trusted_keys_dir": trusted})
    with TestClient(create_app(s, engine), raise_server_exceptions=False) as client:
        tokens = {d: enroll(client, d, ["line1"]) for d in ("gw1", "gw2")}
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        pushed = client.post("/v1/models", content=data,
                             headers={**admin, "Content-Type": "application/gzip"})
        assert pushed.status_code == 201, pushed.text
        ro = client.post("/v1/rollouts", json={"name": "skab-wstat", "version": 1,
                                               "tag": "line1"}, headers=admin)
        assert ro.status_code == 201, ro.text
        yield Fleet(client, tokens, int(ro.json()["id"]))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location inside a JSON value (the root too)."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, where: tuple[Any, ...], new: Any) -> Any:
    if not where:
        return new
    head, rest = where[0], where[1:]
    if isinstance(doc, dict) and head in doc:
        return {**doc, head: _replace(doc[head], rest, new)}
    if isinstance(doc, list) and isinstance(head, int) and head < len(doc):
        return [*doc[:head], _replace(doc[head], rest, new), *doc[head + 1:]]
    return doc


@st.composite
def mutated(draw: st.DrawFn, valid: Any) -> Any:
    doc = valid
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(_paths(doc)))
        doc = _replace(doc, where, draw(json_values))
    if draw(st.booleans()):  # an unknown field too
        doc = {**doc, draw(text_values): draw(json_values)} if isinstance(doc, dict) else doc
    return doc


def _param_values(name: str, fleet: Fleet) -> st.SearchStrategy[str]:
    valid = {"device_id": ["gw1", "gw2"], "name": ["skab-wstat"], "version": ["1", "2"],
             "rollout_id": [str(fleet.rollout_id)], "action": ["promote", "pause", "resume",
                                                                "abort"],
             "stream": ["pump1"], "since": [str(T0)], "until": ["2030-01-01T00:00:00Z"],
             "limit": ["10"], "include_revoked": ["true"]}.get(name, ["x"])
    return st.sampled_from(valid) | text_values | st.integers(-(2**70), 2**70).map(str)


def _encoded(value: str) -> str:
    """Percent-encoded UTF-8 (a lone surrogate gives bytes that are not UTF-8, on purpose)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def requests_for(draw: st.DrawFn, path: str, method: str, fleet: Fleet) -> dict[str, Any]:
    op = DOC["paths"][path][method]
    url = path
    query: list[str] = []
    for param in op.get("parameters", []):
        value = _encoded(draw(_param_values(param["name"], fleet)))
        if param["in"] == "path":
            url = url.replace("{" + param["name"] + "}", value or "%20")
        elif draw(st.booleans()):
            query.append(f"{param['name']}={value}")
    if query:
        url += "?" + "&".join(query)
    auth = draw(st.sampled_from(["admin", "gw1", "gw2", "none", "garbage"]))
    token = {"admin": ADMIN_TOKEN, "garbage": "x\x7f" * 3, "none": ""}.get(
        auth, fleet.tokens.get(auth, ""))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    content = b""
    body = op.get("requestBody", {}).get("content", {})
    if "application/json" in body:
        ref = body["application/json"]["schema"].get("$ref", "")
        valid = examples(fleet.rollout_id).get(ref.rsplit("/", 1)[-1])
        kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "random", "bytes"]))
        kind = "random" if valid is None and kind == "mutated" else kind
        if kind == "bytes":
            content = draw(st.binary(max_size=200))
        else:
            doc = draw(mutated(valid)) if kind == "mutated" else draw(json_values)
            content = json.dumps(doc).encode("utf-8", "surrogatepass")
        headers["Content-Type"] = "application/json"
        if draw(st.booleans()):
            content = gzip.compress(content)
            headers["Content-Encoding"] = "gzip"
    elif body:
        headers["Content-Type"] = next(iter(body))
        content = draw(st.binary(max_size=400))
    return {"method": method.upper(), "url": url, "headers": headers, "content": content}


@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_no_request_gets_a_server_error(fleet: Fleet, path: str, method: str) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        req = data.draw(requests_for(path, method, fleet))
        resp = fleet.client.request(**req)
        assert resp.status_code < 500, (req, resp.status_code, resp.text[:500])

    run()


def test_every_route_is_fuzzed() -> None:
    routes = {(p, m) for p, item in DOC["paths"].items() for m in item}
    assert set(OPERATIONS) == routes
    assert len(routes) >= 18
    bodies = {p for p, m in OPERATIONS if "requestBody" in DOC["paths"][p][m]}
    assert {"/v1/ingest", "/v1/devices", "/v1/samples", "/v1/rollouts", "/v1/models/status",
            "/v1/models"} <= bodies
