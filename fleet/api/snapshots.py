"""Camera alert snapshots: a device uploads them, operators read them.

``PUT /v1/devices/{device_id}/alerts/{alert_id}/snapshot`` (JPEG) and ``.../heatmap`` (PNG):
the device token of ``device_id`` (403 otherwise, the admin token included); the body is the
image itself with ``Content-Type: image/jpeg`` or ``image/png`` (415 otherwise). Steps: the token
is checked before any byte of the body is read; the body is read within
:data:`cloud_sync.protocol.MAX_SNAPSHOT_BYTES` (413: ``Content-Length`` first, then while
streaming); the alert must be stored (404: the device uploads after ingest acknowledged it);
the bytes are opened with Pillow and must be exactly the kind's format, at most
:data:`cloud_sync.protocol.MAX_SNAPSHOT_EDGE` pixels a side (checked from the header before any
pixel is decoded: no decompression bomb), and decode whole (``load``: truncated or corrupt data
refused) (422 for anything else: hostile bytes are never stored). Stored (replacing a previous
one): 204.

``GET`` on the same paths: the admin (operator) token or the device's own; answers the image
with its content type (``X-Content-Type-Options: nosniff``, ``Cache-Control: private``), 404
when there is none. A fleet older than this module answers 404/405 to the ``PUT``; the agent
then keeps its snapshots (:mod:`agent.services.snapshot_upload`).
"""

from __future__ import annotations

import io
import re
import warnings
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from cloud_sync.protocol import (
    ID_PATTERN,
    MAX_SNAPSHOT_BYTES,
    MAX_SNAPSHOT_EDGE,
    PLAIN_PATTERN,
    SNAPSHOT_KINDS,
)
from fleet.api.body import _read_limited
from fleet.api.deps import DeviceDep, PrincipalDep, ServicesDep
from fleet.db.devices import utcnow
from fleet.db.snapshots import SnapshotStore, StoredImage
from fleet.errors import (
    BadRequest,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    Unprocessable,
    UnsupportedMediaType,
)

router = APIRouter()

Kind = Literal["snapshot", "heatmap"]
#: The Pillow format each kind must be.
FORMATS = {"snapshot": "JPEG", "heatmap": "PNG"}
_ALERT_ID = re.compile(ID_PATTERN)
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
DeviceId = Annotated[str, Path(max_length=64, pattern=PLAIN_PATTERN)]
AlertId = Annotated[str, Path(max_length=160, pattern=PLAIN_PATTERN)]


def check_image(data: bytes, kind: str) -> StoredImage:
    """Open ``data`` with Pillow and check it is a whole image of ``kind``'s format.

    Raises:
        Unprocessable: not an image, another format, too large a side, or it does not decode.
    """
    from PIL import Image  # noqa: PLC0415 - lazy: only this route needs Pillow

    want = FORMATS[kind]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[want]) as img:
                width, height = img.size
                if not (0 < width <= MAX_SNAPSHOT_EDGE and 0 < height <= MAX_SNAPSHOT_EDGE):
                    raise Unprocessable(f"{kind} of {width}x{height} pixels is over the "
                                        f"{MAX_SNAPSHOT_EDGE}-pixel limit")
                img.load()
    except Unprocessable:
        raise
    except Exception as exc:  # Pillow raises many types for hostile bytes
        raise Unprocessable(f"{kind} is not a valid {want} image: {type(exc).__name__}: "
                            f"{str(exc)[:200]}") from None
    return StoredImage(SNAPSHOT_KINDS[kind], int(width), int(height), data)


def _store(services: object) -> SnapshotStore:
    store = getattr(services, "snapshots", None)
    if not isinstance(store, SnapshotStore):
        raise NotFound("this fleet does not store snapshots")
    return store


def _check_ids(device_id: str, alert_id: str) -> None:
    if not _NAME.match(device_id) or not _ALERT_ID.match(alert_id) \
            or alert_id.split(":", 1)[0] != device_id:
        raise NotFound(f"no alert {alert_id!r} of device {device_id!r}")


@router.put("/v1/devices/{device_id}/alerts/{alert_id}/{kind}", status_code=204,
            openapi_extra={"requestBody": {
                "required": True,
                "description": "The image itself as the raw body: kind `snapshot` is the "
                               "alerting frame as image/jpeg, kind `heatmap` the anomaly "
                               "overlay as image/png; no Content-Encoding; at most "
                               f"{MAX_SNAPSHOT_BYTES} bytes and {MAX_SNAPSHOT_EDGE} pixels a "
                               "side; it must decode whole.",
                "content": {
                    "image/jpeg": {"schema": {"type": "string", "format": "binary",
                                              "description": "JPEG bytes (kind snapshot)."}},
                    "image/png": {"schema": {"type": "string", "format": "binary",
                                             "description": "PNG bytes (kind heatmap)."}}}}},
            summary="Upload an alert's snapshot (JPEG) or heatmap (PNG)")
async def put_snapshot(device_id: DeviceId, alert_id: AlertId, kind: Kind, request: Request,
                       caller: DeviceDep, services: ServicesDep) -> Response:
    if caller != device_id:
        raise Forbidden("a device can only upload its own snapshots")
    _check_ids(device_id, alert_id)
    store = _store(services)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != SNAPSHOT_KINDS[kind]:
        raise UnsupportedMediaType(f"a {kind} is {SNAPSHOT_KINDS[kind]}, not {ctype!r}")
    if request.headers.get("content-encoding", "identity").strip().lower() != "identity":
        raise UnsupportedMediaType("a snapshot is sent without Content-Encoding")
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise BadRequest("invalid Content-Length")
        if int(length) > MAX_SNAPSHOT_BYTES:
            raise PayloadTooLarge(f"body of {length} bytes is over the "
                                  f"{MAX_SNAPSHOT_BYTES}-byte limit")
    data = await _read_limited(request, MAX_SNAPSHOT_BYTES)
    if not await run_in_threadpool(store.alert_exists, device_id, alert_id):
        raise NotFound(f"no alert {alert_id!r} stored: upload the alert first")
    image = await run_in_threadpool(check_image, data, kind)
    await run_in_threadpool(store.put, device_id, alert_id, kind, image, utcnow())
    return Response(status_code=204)


@router.get("/v1/devices/{device_id}/alerts/{alert_id}/{kind}",
            responses={200: {"content": {"image/jpeg": {}, "image/png": {}}}})
def get_snapshot(device_id: DeviceId, alert_id: AlertId, kind: Kind, principal: PrincipalDep,
                 services: ServicesDep) -> Response:
    principal.check_read(device_id)
    _check_ids(device_id, alert_id)
    image = _store(services).get(device_id, alert_id, kind)
    if image is None:
        raise NotFound(f"no {kind} of alert {alert_id!r}")
    return Response(content=image.data, media_type=image.content_type,
                    headers={"X-Content-Type-Options": "nosniff",
                             "Cache-Control": "private, max-age=3600"})
