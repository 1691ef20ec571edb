"""Payload decoding of the ``mqtt`` source: JSON objects and single numbers (no I/O).

Each decoder returns ``(updates, ts)``: ``updates`` maps channel index -> value, ``ts`` the
reading time in epoch seconds (None = the receive time). Every problem is a
:class:`agent.errors.RecordError` whose ``reason`` labels the reject counter: ``oversized``,
``bad_payload`` (not UTF-8 / not JSON / not an object), ``no_fields`` (none of the mapped fields
is present), ``wrong_type`` (a mapped field is not a number), ``not_a_number``, ``non_finite``,
``bad_timestamp``.

Timestamps (JSON ``timestamp_field``): a number is epoch seconds, or epoch milliseconds when it
is above 1e11 (a date after 5138 in seconds); a string is ISO 8601
(:meth:`datetime.datetime.fromisoformat`, naive = UTC). A time before 1970 or after 9999
(:data:`agent.records.MAX_EPOCH_S`) is ``bad_timestamp``: no clock of a plant device means
it, and later stages could not format it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from typing import Any

from agent.errors import RecordError
from agent.records import MAX_EPOCH_S
from cloud_sync.isotime import fromisoformat

#: Above this a numeric timestamp is taken as epoch milliseconds.
MS_THRESHOLD = 1e11
#: Deepest dotted field path followed.
MAX_PATH_DEPTH = 16


def check_size(payload: bytes, limit: int, topic: str) -> None:
    """Raises RecordError ``oversized`` when ``payload`` exceeds ``limit`` bytes."""
    if len(payload) > limit:
        raise RecordError(f"{len(payload)}-byte payload on {topic[:200]!r} exceeds "
                          f"max_payload_bytes {limit}", reason="oversized")


def number(value: Any, what: str) -> float:
    """``value`` (int, float or bool) as a finite float.

    Raises:
        RecordError: ``wrong_type`` or ``non_finite``.
    """
    if type(value) is float:  # the common case, first: JSON numbers with a point
        if math.isfinite(value):
            return value
        raise RecordError(f"{what} is {value}", reason="non_finite")
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if not isinstance(value, int | float):
        raise RecordError(f"{what} is {type(value).__name__}, not a number", reason="wrong_type")
    try:
        out = float(value)
    except OverflowError:  # an int beyond the float range (JSON integers have no bound)
        out = math.inf
    if not math.isfinite(out):
        raise RecordError(f"{what} is {out}", reason="non_finite")
    return out


def check_epoch(t: float, value: Any) -> float:
    """``t`` (epoch seconds) unchanged when it lies in 1970 .. 9999.

    Raises:
        RecordError: ``bad_timestamp`` (``value`` is the field as received, for the message).
    """
    if not 0.0 <= t <= MAX_EPOCH_S:
        raise RecordError(f"timestamp {str(value)[:64]!r} is not a time: outside 1970 .. 9999",
                          reason="bad_timestamp")
    return t


def parse_time(value: Any) -> float:
    """A timestamp field as epoch seconds (module docstring).

    Raises:
        RecordError: ``bad_timestamp``.
    """
    if type(value) is float and 0.0 <= value <= MS_THRESHOLD:  # epoch seconds, the usual case
        return value
    try:
        if isinstance(value, bool):
            raise TypeError("a boolean")
        if isinstance(value, int | float):
            t = float(value)
            if not math.isfinite(t):
                raise ValueError(f"{t}")
            return check_epoch(t / 1000.0 if abs(t) > MS_THRESHOLD else t, value)
        if isinstance(value, str):
            d = fromisoformat(value)
            aware = d if d.tzinfo else d.replace(tzinfo=dt.timezone.utc)
            return check_epoch(aware.timestamp(), value)
        raise TypeError(type(value).__name__)
    except (TypeError, ValueError, OverflowError) as exc:
        raise RecordError(f"timestamp {str(value)[:64]!r} is not a time: {exc}",
                          reason="bad_timestamp") from exc


#: A dotted field path split at its dots (:func:`field_path`).
FieldPath = tuple[str, ...]
#: What :func:`_walk` returns for a path the object does not have.
_MISSING = object()
_decode = json.JSONDecoder().decode


def field_path(path: str) -> FieldPath:
    """``path`` split at its dots, once per stream rather than once per message.

    >>> field_path("flow.value")
    ('flow', 'value')
    """
    return tuple(path.split("."))


def _walk(obj: Any, parts: FieldPath) -> Any:
    # json.loads makes plain dicts only, so the exact type check is enough
    if len(parts) > MAX_PATH_DEPTH:
        return _MISSING
    for part in parts:
        if type(obj) is not dict:
            return _MISSING
        obj = obj.get(part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def decode_json(payload: bytes, paths: Sequence[FieldPath],
                timestamp_path: FieldPath | None, topic: str
                ) -> tuple[dict[int, float], float | None]:
    """Decode a JSON object; ``paths[i]`` is channel i's field path, ``timestamp_path`` the
    timestamp field's (both from :func:`field_path`; ``timestamp_path`` None = no timestamp
    field, the reading takes the receive time).

    Raises:
        RecordError: see the module docstring.
    """
    try:
        obj = _decode(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordError(f"payload on {topic[:200]!r} is not JSON: {exc}",
                          reason="bad_payload") from exc
    if type(obj) is not dict:
        raise RecordError(f"payload on {topic[:200]!r} is a JSON {type(obj).__name__}, "
                          "not an object", reason="bad_payload")
    updates: dict[int, float] = {}
    for i, parts in enumerate(paths):
        value = obj.get(parts[0], _MISSING) if len(parts) == 1 else _walk(obj, parts)
        if value is _MISSING:
            continue
        if type(value) is float and math.isfinite(value):
            updates[i] = value  # the common case without a call (the message text is not made)
        else:
            updates[i] = number(value, f"field {'.'.join(parts)!r}")
    if not updates:
        names = [".".join(p) for p in paths[:8]]
        raise RecordError(f"payload on {topic[:200]!r} has none of the fields {names}",
                          reason="no_fields")
    ts = None
    if timestamp_path is not None:
        value = _walk(obj, timestamp_path)
        if value is _MISSING:
            raise RecordError(f"payload on {topic[:200]!r} has no "
                              f"{'.'.join(timestamp_path)!r}", reason="bad_timestamp")
        ts = parse_time(value)
    return updates, ts


def decode_number(payload: bytes, topic: str) -> float:
    """One number in ASCII (``21.5``, ``-3e2``, ``true``/``false``).

    Raises:
        RecordError: ``not_a_number`` or ``non_finite``.
    """
    text = payload.decode("ascii", errors="replace").strip()
    low = text.lower()
    if low in ("true", "false"):
        return 1.0 if low == "true" else 0.0
    try:
        value = float(text)
    except ValueError as exc:
        raise RecordError(f"payload on {topic[:200]!r} is not a number: {text[:40]!r}",
                          reason="not_a_number") from exc
    if not math.isfinite(value):
        raise RecordError(f"payload on {topic[:200]!r} is {value}", reason="non_finite")
    return value
