"""Camera alert snapshots on the fleet (SQLite and PostgreSQL): stored beside their alert, served
to the operator with the right content type, hostile bytes refused (fleet/api/snapshots.py)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from fleet.api.snapshots import check_image
from fleet.db.devices import utcnow
from fleet.db.snapshots import SnapshotStore
from tests.fleet.conftest import ADMIN_TOKEN
from tests.fleet.wire import alert, batch, bearer, gz, gzip_headers

Image = pytest.importorskip("PIL.Image")

AID = "gw1:cam1:1"
SNAP = f"/v1/devices/gw1/alerts/{AID}/snapshot"
HEAT = f"/v1/devices/gw1/alerts/{AID}/heatmap"


def encode(fmt: str, size: tuple[int, int] = (64, 48), **kw: Any) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 40, 10)).save(out, fmt, **kw)
    return out.getvalue()


def _with_alert(client: TestClient, token: str) -> None:
    body = gz(batch("gw1", [alert("gw1", "cam1", 1)]))
    resp = client.post("/v1/ingest", content=body, headers=gzip_headers(token))
    assert resp.status_code == 200, resp.text


def put(client: TestClient, path: str, data: bytes, token: str, ctype: str) -> Any:
    return client.put(path, content=data, headers={**bearer(token), "Content-Type": ctype})


def test_snapshot_and_heatmap_are_stored_and_served_to_the_operator(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    token = enrolled["gw1"]
    _with_alert(client, token)
    jpeg, png = encode("JPEG", quality=80), encode("PNG", (80, 60))
    assert put(client, SNAP, jpeg, token, "image/jpeg").status_code == 204
    assert put(client, HEAT, png, token, "image/png").status_code == 204
    assert put(client, SNAP, jpeg, token, "image/jpeg").status_code == 204  # a resend: same
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    got = client.get(SNAP, headers=admin)
    assert got.status_code == 200 and got.headers["content-type"] == "image/jpeg"
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.content == jpeg
    with Image.open(io.BytesIO(got.content)) as img:
        assert img.size == (64, 48)
    heat = client.get(HEAT, headers=admin)
    assert heat.status_code == 200 and heat.headers["content-type"] == "image/png"
    assert heat.content == png
    listed = client.get("/v1/devices/gw1/alerts", headers=admin).json()["items"]
    assert [(a["id"], a["snapshots"]) for a in listed] == [(AID, ["heatmap", "snapshot"])]
    fleet = client.get("/v1/alerts", headers=admin).json()["items"]  # the console's timeline
    assert [(a["id"], a["snapshots"]) for a in fleet] == [(AID, ["heatmap", "snapshot"])]
    assert client.get(SNAP, headers=bearer(token)).status_code == 200  # the device itself
    assert client.get(SNAP, headers=bearer(enrolled["gw2"])).status_code == 403
    assert client.get(SNAP).status_code == 401
    assert client.get("/v1/devices/gw1/alerts/gw1:cam1:2/snapshot",
                      headers=admin).status_code == 404


def _truncated_jpeg() -> bytes:
    data = encode("JPEG", (256, 256), quality=95)
    return data[: len(data) // 2]


def _huge_png() -> bytes:
    """A valid PNG header claiming 20,000 x 20,000 pixels (a decompression bomb)."""
    out = io.BytesIO()
    Image.new("1", (20_000, 20_000)).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize(("path", "ctype", "make"), [
    (SNAP, "image/jpeg", lambda: b"\xff\xd8\xff\xe0" + b"\x00" * 200),  # a JPEG magic, no image
    (SNAP, "image/jpeg", _truncated_jpeg),
    (SNAP, "image/jpeg", lambda: encode("PNG")),  # a PNG sent as the JPEG snapshot
    (HEAT, "image/png", lambda: encode("JPEG")),
    (HEAT, "image/png", _huge_png),
    (HEAT, "image/png", lambda: b"<svg xmlns='http://www.w3.org/2000/svg'/>"),
])
def test_hostile_image_bytes_are_refused_and_never_stored(
    client: TestClient, enrolled: dict[str, str], path: str, ctype: str, make: Any
) -> None:
    token = enrolled["gw1"]
    _with_alert(client, token)
    resp = put(client, path, make(), token, ctype)
    assert resp.status_code == 422, resp.text
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert client.get(path, headers=admin).status_code == 404


def test_snapshot_route_limits(client: TestClient, enrolled: dict[str, str]) -> None:
    token = enrolled["gw1"]
    jpeg = encode("JPEG")
    assert put(client, SNAP, jpeg, token, "image/jpeg").status_code == 404  # no alert yet
    _with_alert(client, token)
    assert put(client, SNAP, jpeg, token, "image/png").status_code == 415
    assert put(client, SNAP, jpeg, token, "application/json").status_code == 415
    assert put(client, SNAP, jpeg, enrolled["gw2"], "image/jpeg").status_code == 403
    admin = f"{ADMIN_TOKEN}"
    assert put(client, SNAP, jpeg, admin, "image/jpeg").status_code == 403  # not a device
    big = b"\xff\xd8" + b"\x00" * (4 * 1024 * 1024)
    assert put(client, SNAP, big, token, "image/jpeg").status_code == 413
    other = "/v1/devices/gw2/alerts/gw2:cam1:1/snapshot"
    assert put(client, other, jpeg, token, "image/jpeg").status_code == 403


def test_retention_keeps_the_newest_images_per_device(
    client: TestClient, enrolled: dict[str, str], engine: Engine
) -> None:
    store = SnapshotStore(engine, keep_per_device=2)
    token = enrolled["gw1"]
    body = gz(batch("gw1", [alert("gw1", "cam1", i) for i in (1, 2, 3)]))
    assert client.post("/v1/ingest", content=body, headers=gzip_headers(token)).status_code == 200
    image = check_image(encode("JPEG"), "snapshot")
    for i in (1, 2, 3):
        store.put("gw1", f"gw1:cam1:{i}", "snapshot", image, utcnow())
    assert store.get("gw1", "gw1:cam1:1", "snapshot") is None
    assert store.get("gw1", "gw1:cam1:2", "snapshot") is not None
    assert store.get("gw1", "gw1:cam1:3", "snapshot") is not None
