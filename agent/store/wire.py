"""Stored rows as ingest wire JSON, built in one pass (no dicts, no pydantic models).

The uploader sends up to 5,000 records per request; parsing each stored row into dicts,
validating the batch with pydantic and dumping it again cost more than the request itself. These
functions write each record's JSON text (``{"kind":..., "id":..., "body":{...}}`` of
:mod:`cloud_sync.protocol`) straight from the row's columns; :func:`cloud_sync.client.batch_json`
splices them into a batch. The fleet validates every record and rejects bad ones by index, so a
bad stored value costs that record (dead-lettered), never the batch: every text made here is
valid JSON whatever the row holds (non-finite numbers become ``null``; JSON columns that do not
parse arrive as ``null``, see :data:`JSON_OR_NULL`).

Floats use ``repr`` (shortest round-trip form, as ``json.dumps`` does), so values are exact.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

RecordKind = Literal["alert", "aggregate"]

#: SQL expression template: the JSON column ``{col}`` if it holds valid JSON, else ``null``.
JSON_OR_NULL = "CASE WHEN json_valid({col}) THEN {col} ELSE 'null' END"

#: JSON string literal of a ``str`` (what ``json.dumps(s, ensure_ascii=False)`` gives; the C
#: function itself, without ``JSONEncoder.encode``'s Python-level dispatch).
_string: Callable[[str], str] = json.encoder.encode_basestring
_isfinite = math.isfinite


@dataclass(frozen=True, slots=True)
class WireRow:
    """One stored record the fleet has not acknowledged, as wire JSON.

    Attributes:
        kind: ``"alert"`` or ``"aggregate"``.
        row_id: Row id in its table (what :meth:`agent.store.sqlite.Store.mark_uploaded` takes).
        record_id: The record's stable wire id.
        json: The record's JSON text (an ``AlertRecord`` / ``AggregateRecord``).
    """

    kind: RecordKind
    row_id: int
    record_id: str
    json: str


def value(v: Any) -> str:
    """JSON text of a column value: finite float, int, None, or text (quoted).

    >>> value(0.30000000000000004), value(float("nan")), value(3), value(None), value('a"b')
    ('0.30000000000000004', 'null', '3', 'null', '"a\\\\"b"')
    """
    kind = type(v)
    if kind is float:
        return repr(v) if _isfinite(v) else "null"
    if kind is str:
        return _string(v)
    if kind is int:
        return str(v)
    if v is None:
        return "null"
    if isinstance(v, str):
        return _string(v)
    return _string(str(v))  # blob or other: the fleet rejects it, the batch stays valid


def alert_record(alert_id: str, payload: str) -> str:
    """An ``AlertRecord`` from the stored MQTT payload (valid JSON text or ``null``)."""
    return f'{{"kind":"alert","id":{value(alert_id)},"body":{payload}}}'


def aggregate_record(row: tuple[Any, ...]) -> str:
    """An ``AggregateRecord`` from ``(aggregate_id, device_id, stream, interval_start,
    interval_s, count, channels JSON text or null, max_score, windows, alert_count)``.

    >>> aggregate_record(("d:s:0", "d", "s", 0.0, 60.0, 1, "[]", None, 1, 0))[:40]
    '{"kind":"aggregate","id":"d:s:0","body":'
    """
    (aggregate_id, device_id, stream, start, length, count, channels, max_score, windows,
     alerts) = row
    return (
        f'{{"kind":"aggregate","id":{value(aggregate_id)},"body":{{'
        f'"device_id":{value(device_id)},"stream":{value(stream)},'
        f'"interval_start":{value(start)},"interval_s":{value(length)},'
        f'"count":{value(count)},"channels":{channels},"max_score":{value(max_score)},'
        f'"windows":{value(windows)},"alert_count":{value(alerts)}}}}}'
    )
