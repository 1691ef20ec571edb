"""Values no database stores (NUL, too long for a column, past int64) are a 4xx, never a 500,
on SQLite and PostgreSQL; status reports are bounded and pruned by age."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, insert, select

from cloud_sync.protocol import MAX_DETAILS, ModelStatusReport
from fleet.app import create_app
from fleet.db.model_tables import model_status_reports
from fleet.db.retention import StatusRetention
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN, enroll
from tests.fleet.model_pkg import make_keys, package
from tests.fleet.wire import T0

BIG = 2**64
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return make_keys(tmp_path / "keys")


@pytest.fixture
def raw_client(settings: Settings, engine: Engine, keys: tuple[Path, Path]) -> Iterator[TestClient]:
    """The app with trusted keys; a server error is a 500 answer, not an exception here."""
    s = Settings(**{**settings.__dict__, "trusted_keys_dir": keys[1]})
    with TestClient(create_app(s, engine), raise_server_exceptions=False) as tc:
        yield tc


def status_body(**change: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"device_id": "gw1", "stream": "pump1", "name": "skab-wstat",
                            "version": 2, "state": "downloaded", "details": {"bytes": 10},
                            "at": T0}
    body.update(change)
    return body


def sample_body(**change: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"device_id": "gw1", "stream": "pump1", "channels": ["a", "b"],
                            "config_hash": "abc", "kind": "reservoir",
                            "windows": [[[1.0, 2.0], [3.0, 4.0]]]}
    body.update(change)
    return body


def rollout_body(**change: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "skab-wstat", "version": 1, "devices": ["gw1"]}
    body.update(change)
    return body


DEVICE_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("status: NUL in reason", "/v1/models/status", status_body(reason="bad\x00")),
    ("status: NUL in details", "/v1/models/status", status_body(details={"k": "a\x00"})),
    ("status: NUL in a details key", "/v1/models/status", status_body(details={"k\x00": 1})),
    ("status: name past its column", "/v1/models/status", status_body(name="m" * 200)),
    ("status: stream past its column", "/v1/models/status", status_body(stream="s" * 200)),
    ("status: NUL in name", "/v1/models/status", status_body(name="a\x00b")),
    ("status: version past int64", "/v1/models/status", status_body(version=BIG)),
    ("status: rollout_id past int64", "/v1/models/status", status_body(rollout_id=BIG)),
    ("status: details int past int64", "/v1/models/status", status_body(details={"n": BIG})),
    ("samples: NUL in a channel", "/v1/samples", sample_body(channels=["a\x00", "b"])),
    ("samples: NUL in config_hash", "/v1/samples", sample_body(config_hash="x\x00")),
    ("samples: model version past int64", "/v1/samples",
     sample_body(model={"name": "m", "version": BIG})),
    ("samples: model name past its column", "/v1/samples",
     sample_body(model={"name": "m" * 100, "version": 1})),
    ("samples: NUL in model name", "/v1/samples", sample_body(model={"name": "m\x00",
                                                                     "version": 1})),
    # a lone surrogate has no UTF-8: neither stored nor quoted back in an error as it is
    ("samples: lone-surrogate key, NUL value", "/v1/samples", {"\ud800": "\x00"}),
    ("status: lone surrogate in reason", "/v1/models/status", status_body(reason="\ud800")),
    ("status: lone-surrogate details key", "/v1/models/status",
     status_body(details={"\ud800": 1})),
]

ADMIN_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("enroll: NUL in a tag", "/v1/devices", {"device_id": "gw9", "tags": ["a\x00"]}),
    ("enroll: tag past 64", "/v1/devices", {"device_id": "gw9", "tags": ["t" * 10_000]}),
    ("rollout: version past int64", "/v1/rollouts", rollout_body(version=BIG)),
    ("rollout: name past its column", "/v1/rollouts", rollout_body(name="m" * 100)),
    ("rollout: NUL in name", "/v1/rollouts", rollout_body(name="m\x00")),
    ("rollout: NUL in tag", "/v1/rollouts", {"name": "m", "version": 1, "tag": "t\x00"}),
    ("rollout: halt_after past int32", "/v1/rollouts", rollout_body(halt_after_failures=2**40)),
    ("rollout: NUL in a device id", "/v1/rollouts", rollout_body(devices=["gw\x00"])),
]

PATH_CASES: list[tuple[str, str, str]] = [
    ("rollout id past int64", "GET", f"/v1/rollouts/{BIG}"),
    ("rollout id past int64, action", "POST", f"/v1/rollouts/{BIG}/pause"),
    ("package version past int64", "GET", f"/v1/models/skab-wstat/{BIG}/package"),
    ("NUL in a revoked device id", "DELETE", "/v1/devices/gw%00x"),
    ("NUL in a model name query", "GET", "/v1/models?name=a%00b"),
    ("device id past its column", "DELETE", "/v1/devices/" + "d" * 300),
]


def _refused(status: int) -> bool:
    return 400 <= status < 500


@pytest.mark.parametrize(("case", "path", "body"), DEVICE_CASES, ids=[c[0] for c in DEVICE_CASES])
def test_device_bodies_no_database_stores_are_refused(
    raw_client: TestClient, case: str, path: str, body: dict[str, Any]
) -> None:
    auth = {"Authorization": f"Bearer {enroll(raw_client, 'gw1')}"}
    resp = raw_client.post(path, content=json.dumps(body).encode(), headers={
        **auth, "Content-Type": "application/json"})
    assert resp.status_code == 422, (case, resp.status_code, resp.text)


@pytest.mark.parametrize(("case", "path", "body"), ADMIN_CASES, ids=[c[0] for c in ADMIN_CASES])
def test_admin_bodies_no_database_stores_are_refused(
    raw_client: TestClient, case: str, path: str, body: dict[str, Any]
) -> None:
    enroll(raw_client, "gw1")
    resp = raw_client.post(path, content=json.dumps(body), headers={
        **ADMIN, "Content-Type": "application/json"})
    assert resp.status_code == 422, (case, resp.status_code, resp.text)


@pytest.mark.parametrize(("case", "method", "path"), PATH_CASES, ids=[c[0] for c in PATH_CASES])
def test_path_and_query_values_no_database_stores_are_refused(
    raw_client: TestClient, case: str, method: str, path: str
) -> None:
    resp = raw_client.request(method, path, headers=ADMIN)
    assert _refused(resp.status_code), (case, resp.status_code, resp.text)


def test_manifest_version_past_int64_is_refused(
    raw_client: TestClient, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    from cloud_sync.package import pack  # noqa: PLC0415

    pkg = package(tmp_path, BIG, keys[0])
    out = tmp_path / "big.tar.gz"
    pack(pkg, out)
    resp = raw_client.post("/v1/models", content=out.read_bytes(),
                           headers={**ADMIN, "Content-Type": "application/gzip"})
    assert resp.status_code == 422, resp.text
    assert "PackageFormatError" in resp.json()["detail"]


def test_manifest_nested_too_deeply_is_refused(raw_client: TestClient) -> None:
    # json.loads raised RecursionError on a 100,000-deep manifest.json: the upload was a 500
    import io  # noqa: PLC0415
    import tarfile  # noqa: PLC0415

    data = b"[" * 100_000
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    resp = raw_client.post("/v1/models", content=buf.getvalue(),
                           headers={**ADMIN, "Content-Type": "application/gzip"})
    assert resp.status_code == 422, resp.text
    assert "nests too deeply" in resp.json()["detail"]


# --- status reports: bounded, and kept by age ---------------------------------------------------


def test_status_report_details_are_bounded(raw_client: TestClient) -> None:
    auth = {"Authorization": f"Bearer {enroll(raw_client, 'gw1')}",
            "Content-Type": "application/json"}
    many = status_body(details={f"k{i}": i for i in range(MAX_DETAILS + 1)})
    assert raw_client.post("/v1/models/status", content=json.dumps(many),
                           headers=auth).status_code == 422
    long_text = status_body(details={"k": "x" * 100_000})
    assert raw_client.post("/v1/models/status", content=json.dumps(long_text),
                           headers=auth).status_code == 413  # over the route's 64 KiB
    ok = status_body(details={f"k{i}": "x" * 500 for i in range(MAX_DETAILS)})
    assert raw_client.post("/v1/models/status", content=json.dumps(ok),
                           headers=auth).status_code == 204


def _report_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model_status_reports))
                   .scalar_one())


def test_old_status_reports_are_pruned_by_age(raw_client: TestClient, engine: Engine) -> None:
    auth = {"Authorization": f"Bearer {enroll(raw_client, 'gw1')}",
            "Content-Type": "application/json"}
    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=400)
    with engine.begin() as conn:
        conn.execute(insert(model_status_reports), [
            {"device_id": "gw1", "name": "skab-wstat", "version": 1, "state": "active",
             "details": {}, "at": T0, "received_at": old}
            for _ in range(3)
        ])
    # the default retention (90 days) prunes on the next report the process stores
    assert raw_client.post("/v1/models/status", content=json.dumps(status_body()),
                           headers=auth).status_code == 204
    assert _report_count(engine) == 1


def test_retention_prunes_at_most_once_per_interval(engine: Engine, client: TestClient) -> None:
    enroll(client, "gw1")
    now = [dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)]
    retention = StatusRetention(engine, 86400, every_s=3600, clock=lambda: now[0])
    with engine.begin() as conn:
        conn.execute(insert(model_status_reports).values(
            device_id="gw1", name="m", version=1, state="active", details={}, at=T0,
            received_at=now[0] - dt.timedelta(days=2)))
    assert retention.maybe_prune() == 1
    with engine.begin() as conn:
        conn.execute(insert(model_status_reports).values(
            device_id="gw1", name="m", version=1, state="active", details={}, at=T0,
            received_at=now[0] - dt.timedelta(days=2)))
    now[0] += dt.timedelta(minutes=30)
    assert retention.maybe_prune() == 0  # pruned 30 min ago
    now[0] += dt.timedelta(minutes=31)
    assert retention.maybe_prune() == 1
    assert ModelStatusReport.model_fields["details"].metadata  # bounded in the wire schema


# --- every string path or query parameter: control characters are a 4xx, never a 500 ----------

#: ``GET /v1/audit?actor=%00`` was a 500 on PostgreSQL (a retest of issue 15): each string
#: parameter the OpenAPI lists is checked here, so a new one without a bound fails this file.
CONTROL_VALUES = ["a\x00b", "\x00", "a\x01b", "a\nb", "a\x7fb"]


def _string_params() -> list[tuple[str, str, str, str]]:
    from tests.fleet.test_fuzz_routes import DOC  # noqa: PLC0415

    out = []
    for path, item in DOC["paths"].items():
        for method, op in item.items():
            for param in op.get("parameters", []):
                schema = param["schema"]
                kinds = [schema, *schema.get("anyOf", [])]
                if any(k.get("type") == "string" for k in kinds):
                    out.append((method.upper(), path, param["in"], param["name"]))
    return out


STRING_PARAMS = _string_params()
_VALID = {"device_id": "gw1", "alert_id": "gw1:pump1:1", "kind": "snapshot", "name": "skab-wstat",
          "version": "1", "rollout_id": "1", "action": "pause", "username": "admin"}


def test_every_string_parameter_is_bounded_against_control_characters() -> None:
    import re  # noqa: PLC0415

    from tests.fleet.test_fuzz_routes import DOC  # noqa: PLC0415

    loose = []
    for method, path, _where, name in STRING_PARAMS:
        param = next(p for p in DOC["paths"][path][method.lower()]["parameters"]
                     if p["name"] == name)
        kinds = [param["schema"], *param["schema"].get("anyOf", [])]
        strings = [k for k in kinds if k.get("type") == "string"]
        for k in strings:
            if "enum" in k:
                continue
            pattern = k.get("pattern")
            if pattern is None or any(re.search(pattern, v) for v in CONTROL_VALUES):
                loose.append(f"{method} {path} {name}")
    assert not loose, loose


@pytest.mark.parametrize(("method", "path", "where", "name"), STRING_PARAMS,
                         ids=[f"{m} {p} {n}" for m, p, _w, n in STRING_PARAMS])
def test_control_characters_in_string_parameters_are_refused(
    raw_client: TestClient, method: str, path: str, where: str, name: str
) -> None:
    from urllib.parse import quote  # noqa: PLC0415

    enroll(raw_client, "gw1")
    for value in CONTROL_VALUES:
        url = path
        for key, good in _VALID.items():
            url = url.replace("{" + key + "}", quote(value, safe="") if key == name else good)
        if where == "query":
            url += f"?{name}={quote(value, safe='')}"
        resp = raw_client.request(method, url, headers=ADMIN)
        assert _refused(resp.status_code), (method, url, resp.status_code, resp.text[:300])
