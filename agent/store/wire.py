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

Schema 2 (:class:`cloud_sync.protocol.AggregateColumns`): :func:`aggregate_columns` turns the
fetched aggregate rows into columns (``zip``) and each column into a JSON array with ONE
``pydantic_core.to_json`` call (Rust; floats in shortest round-trip form too, non-finite ones as
``null``); the stored channels text goes as a JSON string, unparsed. No Python code runs per row
unless a column holds a value ``to_json`` refuses (a blob that is not UTF-8), which takes the
per-value path of :func:`value` for that column.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_core import PydanticSerializationError, to_json

RecordKind = Literal["alert", "aggregate"]

#: SQL expression template: the JSON column ``{col}`` if it holds valid JSON, else ``null``.
JSON_OR_NULL = "CASE WHEN json_valid({col}) THEN {col} ELSE 'null' END"

#: An alert's upload body: the stored payload without its ``snapshot`` key (the MQTT payload
#: names the snapshot's topics; the fleet gets the snapshot itself on its own route, and a
#: fleet older than snapshots would reject an alert with an unknown key), SQLite's
#: ``json_remove`` keeping the text as stored otherwise.
ALERT_UPLOAD_BODY = ("CASE WHEN json_valid(payload) THEN json_remove(payload, '$.snapshot') "
                     "ELSE 'null' END")

#: The aggregates columns :func:`aggregate_columns` takes, in order (SQL select list). The
#: channels text goes as a string (not spliced in as JSON), so it is not checked here: a
#: damaged one costs its record at the fleet, never the batch.
AGGREGATE_SELECT = (
    "id, aggregate_id, stream, interval_start, interval_s, count, channels, max_score, windows,"
    " alert_count"
)
#: Wire names of the columns after ``id`` in :data:`AGGREGATE_SELECT`.
_COLUMN_NAMES = (
    "ids", "streams", "interval_start", "interval_s", "count", "channels", "max_score",
    "windows", "alert_count",
)

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


@dataclass(frozen=True, slots=True)
class AggregateColumnsText:
    """Aggregate rows as one schema-2 ``aggregates`` object.

    Attributes:
        row_ids: Row ids in the store, in column order (index ``i`` is entry ``i``).
        json: JSON text of a :class:`cloud_sync.protocol.AggregateColumns`.
    """

    row_ids: list[int]
    json: str


def aggregate_columns(rows: list[tuple[Any, ...]]) -> AggregateColumnsText:
    """The columns of ``rows`` fetched with :data:`AGGREGATE_SELECT` (at least one row).

    >>> aggregate_columns([(7, "d:s:0", "s", 0.0, 60.0, 1, "[]", None, 1, 0)]).json[:46]
    '{"ids":["d:s:0"],"streams":["s"],"interval_sta'
    """
    row_ids, *columns = zip(*rows, strict=True)
    parts = [
        f'"{name}":{_array(column)}' for name, column in zip(_COLUMN_NAMES, columns, strict=True)
    ]
    return AggregateColumnsText(list(row_ids), "{" + ",".join(parts) + "}")


def _array(column: tuple[Any, ...]) -> str:
    """JSON array text of a column (see the module docstring)."""
    try:
        return to_json(column, inf_nan_mode="null").decode()
    except (PydanticSerializationError, UnicodeDecodeError, ValueError):
        return "[" + ",".join(map(value, column)) + "]"


#: Keys of an alert payload that schema 1 does not have (:meth:`agent.records.Alert.to_payload`).
_LIFECYCLE_KEYS = ("event", "episode_id", "peak_score", "reason")


def schema1_alert(row: WireRow) -> WireRow | None:
    """``row`` (an alert record) as a fleet older than lifecycles takes it: a ``raised`` event
    with its body in schema 1 (the lifecycle keys removed), or None for an ``updated`` or
    ``cleared`` event, which schema 1 cannot carry. A record whose body does not parse as an
    object is returned unchanged (the fleet rejects it by index).

    >>> r = WireRow("alert", 1, "d:s:1", alert_record("d:s:1", '{"schema":2,"event":"raised",'
    ...             '"episode_id":"d:s:1","alert_id":"d:s:1"}'))
    >>> schema1_alert(r).json
    '{"kind":"alert","id":"d:s:1","body":{"schema":1,"alert_id":"d:s:1"}}'
    """
    try:
        record = json.loads(row.json)
    except ValueError:
        return row
    body = record.get("body") if isinstance(record, dict) else None
    if not isinstance(body, dict) or body.get("schema") != 2:
        return row
    if body.get("event", "raised") != "raised":
        return None
    old = {k: v for k, v in body.items() if k not in _LIFECYCLE_KEYS}
    old["schema"] = 1
    text = json.dumps(old, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return WireRow(row.kind, row.row_id, row.record_id, alert_record(row.record_id, text))
