"""Small JSON request bodies read after authentication, bounded, and documented in OpenAPI.

A route that declares its body as a parameter (``body: dict[str, Any]``) makes FastAPI read and
parse the whole body BEFORE the route's dependencies run, so an unauthenticated client could make
the fleet hold and parse any number of large bodies (four 250 MB bodies held 2.2 GB). The routes
here take the :class:`~starlette.requests.Request` instead and call :func:`read_model` in the
route body, i.e. after the token dependency answered: without a valid token nothing of the body
is read (401 at once). The body is then read within a per-route byte limit (raw and, for gzip,
inflated: :func:`fleet.api.body.read_body`), parsed, checked for values no database stores
(NUL characters, integers outside int64, NaN: :func:`fleet.ingest.unstorable`) and validated as
the route's pydantic model (422 with the errors).

Since FastAPI no longer sees these bodies, :func:`body_doc` gives a route's ``openapi_extra``
(the model's JSON schema as the request body) and :func:`install_openapi` adds the models'
schemas to ``components.schemas``, so clients and the fuzz tests see the real schema.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from fleet.api.body import parse_json, read_body
from fleet.errors import Unprocessable
from fleet.ingest import unstorable

M = TypeVar("M", bound=BaseModel)

#: Body limits (bytes, after inflating) of the small JSON routes.
ENROLL_MAX_BYTES = 64 * 1024
STATUS_MAX_BYTES = 64 * 1024
#: A rollout may list up to 10,000 device ids of at most 64 characters.
ROLLOUT_MAX_BYTES = 1024 * 1024
#: Above this size the parse and checks run in the thread pool, not on the event loop.
_INLINE_BYTES = 64 * 1024

_documented: dict[str, type[BaseModel]] = {}
_REF = "#/components/schemas/{model}"


async def read_model(request: Request, model: type[M], max_bytes: int) -> M:
    """Read, parse, check and validate the body of an authenticated request.

    Args:
        request: The request (its token already checked by the route's dependencies).
        model: The pydantic model of the body.
        max_bytes: Largest body, bytes (raw and inflated).

    Raises:
        PayloadTooLarge: Over ``max_bytes`` (413).
        UnsupportedMediaType: Not JSON, or an encoding other than gzip/identity (415).
        BadRequest: Not UTF-8 or not JSON, broken gzip (400).
        Unprocessable: A value no database stores, or the model refuses the body (422).
    """
    data = await read_body(request, max_bytes)
    if len(data) > _INLINE_BYTES:
        return await run_in_threadpool(validate, model, data)
    return validate(model, data)


def validate(model: type[M], data: bytes) -> M:
    """Parse ``data`` as JSON and validate it as ``model`` (see :func:`read_model`)."""
    parsed = parse_json(data)
    bad = unstorable(parsed)
    if bad is not None:
        raise Unprocessable(bad)
    try:
        return model.model_validate(parsed)
    except ValidationError as exc:
        raise Unprocessable([
            {"loc": list(err["loc"]), "msg": err["msg"]}
            for err in exc.errors(include_url=False, include_input=False)[:20]
        ]) from None


#: ``openapi_extra`` of an action route that reads no body (``POST .../abort``): documented as
#: an optional empty object, so every write route in ``/openapi.json`` states its body.
NO_BODY: dict[str, Any] = {"requestBody": {
    "required": False, "description": "No body is read (an empty object may be sent).",
    "content": {"application/json": {"schema": {"type": "object", "maxProperties": 0}}},
}}


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route whose JSON body is ``model`` (read by :func:`read_model`)."""
    _documented[model.__name__] = model
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {
        "required": True, "content": {"application/json": {"schema": schema}},
    }}


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` include the schemas of the models given to :func:`body_doc`."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, model in _documented.items():
            found = model.model_json_schema(ref_template=_REF, mode="validation")
            for sub, sub_schema in found.pop("$defs", {}).items():
                schemas.setdefault(sub, sub_schema)
            schemas[name] = found
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
