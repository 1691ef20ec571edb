"""Model registry routes.

* ``POST /v1/models`` (operator; recorded in the audit log, ``uploaded_by`` = the operator):
  body = a package archive (tar.gz, ``Content-Type:
  application/gzip`` or ``application/octet-stream``, at most 64 MiB). 201 with the stored
  package; 422 when it is not a valid package, unsigned, signed by an untrusted key or an
  artefact hash differs (``detail`` starts with the error class: ``PackageFormatError``,
  ``SignatureError``, ``HashMismatch``); 409 when the version exists; 413 too large.
* ``GET /v1/models`` (viewer): every package (``?name=`` filters).
* ``GET /v1/models/{name}/{version}/package`` (viewer, or a device the package is assigned to:
  one of its rollouts assigns it now, or an abort sends it back to it; any other package, stored
  or not, is 403 for a device): the archive.
  ``ETag: "<sha256>"``, ``Accept-Ranges: bytes``. ``Range: bytes=a-b | a- | -n`` (one range,
  RFC 9110 §14.1.2) → 206 with ``Content-Range: bytes a-b/size``; an unparsable, multi-part or
  unsatisfiable range → 416 with ``Content-Range: bytes */size``. ``If-Range`` other than the
  ETag → the whole archive (200). ``If-None-Match`` equal to the ETag → 304. The archive is
  checked first (hashed, or compared with the same package's bytes already verified): one that
  no longer matches its recorded sha256 → 500 ``corrupt_archive``
  (:mod:`fleet.registry.integrity`: marked corrupt, counted in
  ``fleet_model_archive_corrupt_total``).
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from cloud_sync.protocol import INT64_MAX, NAME_PATTERN, PLAIN_PATTERN
from fleet.api.auditing import arecord
from fleet.api.deps import OperatorDep, PrincipalDep, ServicesDep, ViewerDep
from fleet.api.handlers import error_response
from fleet.api.model_loop import ModelLoopDep
from fleet.errors import CorruptArchive, Forbidden, PayloadTooLarge, UnsupportedMediaType
from fleet.registry.store import ModelRecord
from fleet.registry.views import ModelList, ModelOut

router = APIRouter()
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_TYPES = ("application/gzip", "application/x-gzip", "application/octet-stream", "")


def _out(rec: ModelRecord) -> ModelOut:
    return ModelOut(
        name=rec.name, version=rec.version, archive_sha256=rec.archive_sha256, size=rec.size,
        key_id=rec.key_id, description=rec.description, uploaded_at=rec.uploaded_at,
        uploaded_by=rec.uploaded_by, corrupt=rec.corrupt,
    )


_ARCHIVE_BODY = {"requestBody": {
    "required": True,
    "description": "A signed model package archive: the tar.gz of the package directory "
                   "(manifest.json, its Ed25519 signature and artefacts; `edge-fleet model sign`, "
                   "then `model pack`), as the raw body with Content-Type application/gzip "
                   "(application/octet-stream is taken too); at most the fleet's upload limit "
                   "(64 MiB by default).",
    "content": {"application/gzip": {"schema": {
        "type": "string", "format": "binary",
        "description": "The package archive's bytes (tar.gz)."}}}}}


@router.post("/v1/models", status_code=201, response_model=ModelOut, openapi_extra=_ARCHIVE_BODY)
async def upload(request: Request, loop: ModelLoopDep, who: OperatorDep) -> ModelOut:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in _TYPES:
        raise UnsupportedMediaType(f"send the archive as application/gzip, not {ctype}")
    limit = loop.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"package archive over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"package archive over {limit} bytes")
        chunks.append(chunk)
    rec = await run_in_threadpool(loop.registry.add, b"".join(chunks), who.actor)
    await arecord(request, who, "model.push", f"{rec.name}@{rec.version}",
                  {"sha256": rec.archive_sha256, "key_id": rec.key_id})
    return _out(rec)


@router.get("/v1/models", response_model=ModelList)
def list_models(
    loop: ModelLoopDep, _viewer: ViewerDep,
    name: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
) -> ModelList:
    return ModelList(models=[_out(r) for r in loop.registry.list(name)])


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """Inclusive ``(first, last)`` byte positions of a single ``bytes=`` range, or None when
    unsatisfiable or malformed (RFC 9110 §14.1.2).

    >>> parse_range("bytes=10-", 100), parse_range("bytes=-10", 100)
    ((10, 99), (90, 99))
    >>> parse_range("bytes=5-500", 100), parse_range("bytes=100-", 100)
    ((5, 99), None)
    >>> parse_range("bytes=5-1", 100), parse_range("bytes=0-1,4-5", 9), parse_range("x", 9)
    (None, None, None)
    """
    m = _RANGE.match(header.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        return None
    if not m.group(1):
        n = int(m.group(2))
        return (max(0, size - n), size - 1) if n > 0 and size > 0 else None
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else size - 1
    if first >= size or last < first:
        return None
    return first, min(last, size - 1)


@router.get("/v1/models/{name}/{version}/package")
def download(
    name: Annotated[str, Path(max_length=64, pattern=PLAIN_PATTERN)],
    version: Annotated[int, Path(ge=1, le=INT64_MAX)], request: Request,
    loop: ModelLoopDep, who: PrincipalDep, services: ServicesDep,
) -> Response:
    if not re.fullmatch(NAME_PATTERN, name):
        return error_response(404, "not_found", f"model {name}@{version} is not in the registry")
    device = who.device_id
    if device is not None and not loop.rollouts.may_download(device, name, version):
        raise Forbidden(f"model {name}@{version} is not assigned to device {device}")
    try:
        data, sha = loop.registry.archive(name, version)
    except CorruptArchive:
        services.metrics.model_archive_corrupt.inc()
        raise
    etag = f'"{sha}"'
    headers = {"ETag": etag, "Accept-Ranges": "bytes", "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    ranged = request.headers.get("range")
    if_range = request.headers.get("if-range")
    if ranged is None or (if_range is not None and if_range != etag):
        return Response(data, media_type="application/gzip", headers=headers)
    span = parse_range(ranged, len(data))
    if span is None:
        return error_response(
            416, "range_not_satisfiable", f"range {ranged!r} does not fit {len(data)} bytes",
            {**headers, "Content-Range": f"bytes */{len(data)}"},
        )
    first, last = span
    headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
    return Response(
        data[first:last + 1], status_code=206, media_type="application/gzip", headers=headers
    )
