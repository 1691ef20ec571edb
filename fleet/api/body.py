"""Reading a JSON request body safely: size limits, gzip without bombs, strict JSON.

Limits (all give a 4xx, never a 500):

* ``Content-Length`` over the limit: 413 before reading anything;
* raw bytes over the limit while streaming (no or lying ``Content-Length``): 413;
* ``Content-Encoding: gzip`` is inflated incrementally with ``max_length`` so the decompressed
  size never exceeds the limit in memory (a 16 MiB cap stops a 10 KiB gzip bomb at 16 MiB + 1);
  not gzip, truncated gzip or trailing garbage: 400; any other encoding: 415;
* ``Content-Type`` other than ``application/json`` (when present): 415;
* not UTF-8 or not JSON: 400. ``NaN``/``Infinity`` literals parse (to float) and are rejected
  per record by :mod:`fleet.ingest`.

:func:`read_body` stops after the limits and gzip (ingest checks the raw bytes in one pass, see
:mod:`fleet.ingest`); :func:`parse_json` tries ``pydantic_core.from_json`` (Rust; exact big
integers, a nesting limit of 200, refuses ``NaN`` literals and lone surrogates) and falls back to
the stdlib ``json`` for whatever it refuses, so every body is accepted or refused as before.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from pydantic_core import from_json
from starlette.requests import ClientDisconnect, Request

from fleet.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType

_CHUNK = 64 * 1024


async def read_json(request: Request, max_bytes: int) -> Any:
    """Read, inflate and parse the request body (:func:`read_body`, :func:`parse_json`)."""
    return parse_json(await read_body(request, max_bytes))


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read and inflate the request body of a JSON request.

    Args:
        request: The incoming request.
        max_bytes: Largest body accepted, compressed and decompressed (bytes).

    Returns:
        The body bytes (inflated), not parsed yet.

    Raises:
        PayloadTooLarge: The body is over ``max_bytes`` (before or after inflating).
        UnsupportedMediaType: Not JSON, or an encoding other than gzip/identity.
        BadRequest: Broken gzip, client went away.
    """
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if ctype.lower() != "application/json":
        raise UnsupportedMediaType(f"Content-Type must be application/json, not {ctype!r}")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise UnsupportedMediaType(f"Content-Encoding must be gzip or identity, not {encoding!r}")
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise BadRequest("invalid Content-Length")
        if int(length) > max_bytes:
            raise PayloadTooLarge(f"body of {length} bytes is over the {max_bytes}-byte limit")
    raw = await _read_limited(request, max_bytes)
    return _gunzip(raw, max_bytes) if encoding == "gzip" else raw


def parse_json(data: bytes) -> Any:
    """Parse a JSON body, fast when possible, as the stdlib would (module docstring).

    Raises:
        BadRequest: Not UTF-8, or not JSON.

    >>> parse_json(b'{"a": [1, 2.5, "x", 18446744073709551616]}')
    {'a': [1, 2.5, 'x', 18446744073709551616]}
    >>> parse_json(b'[NaN, "\\\\u0000"]')
    [nan, '\\x00']
    """
    try:
        return from_json(data, cache_strings="keys")
    except ValueError:
        pass  # NaN literal, lone surrogate, deep nesting, ... or broken: the stdlib decides
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest("body is not UTF-8") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None


async def _read_limited(request: Request, max_bytes: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge(f"body is over the {max_bytes}-byte limit")
            parts.append(chunk)
    except ClientDisconnect:
        raise BadRequest("client disconnected while sending the body") from None
    return b"".join(parts)


def _gunzip(raw: bytes, max_bytes: int) -> bytes:
    """Inflate a gzip stream (one member), never holding more than ``max_bytes + 1`` bytes."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out: list[bytes] = []
    size = 0
    data = raw
    try:
        while True:  # empty input still loops: zlib may hold output for consumed input
            piece = inflater.decompress(data, min(_CHUNK, max_bytes + 1 - size))
            size += len(piece)
            out.append(piece)
            if size > max_bytes:
                raise PayloadTooLarge(f"decompressed body is over the {max_bytes}-byte limit")
            if inflater.eof:
                break
            data = inflater.unconsumed_tail
            if not piece and not data:
                break
    except zlib.error as exc:
        raise BadRequest(f"body is not valid gzip: {exc}") from None
    if not inflater.eof:
        raise BadRequest("gzip body is truncated")
    if inflater.unused_data.strip(b"\0"):
        raise BadRequest("data after the end of the gzip stream")
    return b"".join(out)
