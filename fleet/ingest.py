"""Ingest validation: envelope first, then each record on its own (pure code, no I/O).

A batch is parsed in two steps so that one bad record never fails the others: the envelope
(:class:`Envelope`: everything of :class:`cloud_sync.protocol.IngestBatch` but the records, which
stay raw) must be valid or the whole request is refused (422); each record is then validated
alone (:func:`validate_record`) and either becomes a row for the store or a ``rejected`` result
with a reason. Records sharing ``(kind, id)`` within one batch are stored once; later copies
report ``duplicate`` (the same id is the same record, by contract).

Fast path (:func:`check_batch`, then :func:`prepare_checked`): the raw body bytes go through
ONE strict call of a validate-only twin of the batch schema (:mod:`fleet.checker`: JSON parsed
and checked in one pass by pydantic-core, no model instances, no type coercion, so the values
are exactly what the schema accepted, plus database bounds on every number and no ``\\u0000``
escape, so :func:`unstorable` has nothing left to find); rows are built from the checked dicts.
Only when that call finds any error does the batch take the slow path: envelope model, then each
record validated alone, which is what tells the device which index failed and why. Both paths
accept and reject the same records: the fast check accepts a subset of what the slow path
accepts (strict mode refuses ``"count": "5"``, which the lenient path coerces; the extra bounds
refuse what :func:`unstorable` would), and such batches simply take the slow path.

Schema 2 (aggregates as columns, :class:`cloud_sync.protocol.AggregateColumns`): the fast check
covers the columns as typed arrays in the same one call, then every ``channels`` text is checked
alone, strict and storable (:func:`fleet.channels.channels_ok`, msgspec: each string one whole
value, so a text that would only make sense next to its neighbours cannot pass);
:func:`prepare_columns` then checks ownership (every id starts with ``<token's device>:
<streams[i]>:``; the id pattern, part suffix included, was checked before) and in-batch repeats
with a few C-level passes, and hands the columns to the store as they are
(:class:`fleet.db.records.AggregateColumnRows`: channels stored as the text the device sent).
The slow path turns each column entry back into the record it stands for
(:func:`column_records`: ``{"kind": "aggregate", "id": ids[i], "body": {...}}`` with the batch's
device and ``channels`` parsed from its text), appended after ``records``, so schema 2 accepts,
rejects (same reasons, e.g. ``body.count: ...``) and stores exactly what schema 1 would for the
same aggregates. Column lists of unequal lengths, or more than ``MAX_BATCH_RECORDS`` records and
entries together, fail the whole batch (422 / 413, :func:`check_columns`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from cloud_sync.isotime import fromisoformat
from cloud_sync.protocol import (
    AGGREGATE_COLUMNS,
    MAX_BATCH_RECORDS,
    AggregateRecord,
    AlertRecord,
    IngestBatch,
    RecordResult,
)
from fleet.channels import channels_ok
from fleet.checker import checker
from fleet.db.records import AggregateColumnRows

Kind = Literal["alert", "aggregate"]
_MAX_REASON = 300
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_RECORD = TypeAdapter[AlertRecord | AggregateRecord](
    Annotated[AlertRecord | AggregateRecord, Field(discriminator="kind")]
)


class RawColumns(BaseModel):
    """:class:`~cloud_sync.protocol.AggregateColumns` with entries not validated yet."""

    model_config = ConfigDict(extra="forbid")

    ids: list[Any] = Field(max_length=MAX_BATCH_RECORDS)
    streams: list[Any] = Field(max_length=MAX_BATCH_RECORDS)
    interval_start: list[Any] = Field(max_length=MAX_BATCH_RECORDS)
    interval_s: list[Any] = Field(max_length=MAX_BATCH_RECORDS)
    count: list[Any] = Field(max_length=MAX_BATCH_RECORDS)
    channels: list[Any] = Field(max_length=MAX_BATCH_RECORDS)
    max_score: list[Any] = Field(max_length=MAX_BATCH_RECORDS)
    windows: list[Any] = Field(max_length=MAX_BATCH_RECORDS)
    alert_count: list[Any] = Field(max_length=MAX_BATCH_RECORDS)


class Envelope(IngestBatch):
    """An :class:`~cloud_sync.protocol.IngestBatch` whose records are not validated yet."""

    records: list[Any] = Field(max_length=MAX_BATCH_RECORDS)
    aggregates: RawColumns | None = None  # type: ignore[assignment]


class ColumnsInvalid(ValueError):
    """A schema-2 batch's columns are unusable as a whole (the API answers ``status``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_columns(schema: int, n_records: int, columns: dict[str, list[Any]] | None) -> int:
    """Entries in ``columns`` (0 for none) after the whole-batch rules of schema 2.

    Raises:
        ColumnsInvalid: 422 columns in a schema-1 batch or of unequal lengths; 413 records and
            entries together over ``MAX_BATCH_RECORDS``.
    """
    if columns is None:
        return 0
    if schema < 2:
        raise ColumnsInvalid(422, "aggregates: columns need schema 2")
    lengths = {name: len(columns[name]) for name in AGGREGATE_COLUMNS}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} {n}" for name, n in lengths.items())
        raise ColumnsInvalid(422, f"aggregates: columns of unequal lengths ({listed})")
    n = lengths["ids"]
    if n_records + n > MAX_BATCH_RECORDS:
        raise ColumnsInvalid(
            413, f"batch of {n_records + n} records is over the {MAX_BATCH_RECORDS}-record limit"
        )
    return n


class _TaggedBatch(IngestBatch):
    """The same batch schema with records told apart by ``kind`` (what the fast path checks)."""

    records: list[Annotated[AlertRecord | AggregateRecord, Field(discriminator="kind")]] = Field(
        max_length=MAX_BATCH_RECORDS
    )


#: The fast path's one-call check of a whole body (module docstring).
_BATCH = checker(_TaggedBatch, storable=True)


def check_batch(data: bytes) -> dict[str, Any] | None:
    """The body as checked dicts when it passes the fast path's check, else None.

    The result has the wire names of :class:`~cloud_sync.protocol.IngestBatch` (``schema``,
    ``device_id``, ``sent_at``, ``agent_version``, ``model``, ``backlog``, ``aggregates``,
    ``records``); ``aggregates`` (None or a dict of column lists) has passed
    :func:`check_columns` and the channels check.
    """
    if b"\\u0000" in data:
        return None
    try:
        checked: dict[str, Any] = _BATCH.validate_json(data, strict=True)
    except ValidationError:
        return None
    columns = checked.get("aggregates")
    if columns is not None:
        try:
            check_columns(checked["schema"], len(checked["records"]), columns)
        except ColumnsInvalid:
            return None
        if not channels_ok(columns["channels"]):
            return None
    return checked


@dataclass
class Prepared:
    """A batch after per-record validation.

    Attributes:
        rows: ``kind -> [(index, row dict for the table)]``, first copy of each id only.
        results: Index -> result, filled for rejected records and in-batch repeats.
        repeats: Index of a later copy -> index of the first copy with the same ``(kind, id)``.
        columns: Schema-2 aggregates to store as columns (fast path only; their indexes in
            ``columns.indexes``, first copies only).
    """

    rows: dict[Kind, list[tuple[int, dict[str, Any]]]] = field(
        default_factory=lambda: {"alert": [], "aggregate": []}
    )
    results: dict[int, RecordResult] = field(default_factory=dict)
    repeats: dict[int, int] = field(default_factory=dict)
    columns: AggregateColumnRows | None = None


def _prepare(
    records: list[Any], row_of: Callable[[Any], tuple[Kind, dict[str, Any]]]
) -> Prepared:
    """Turn records into rows with ``row_of``; rejected ones and in-batch repeats by index."""
    out = Prepared()
    first: dict[tuple[Kind, str], int] = {}
    for index, raw in enumerate(records):
        try:
            kind, row = row_of(raw)
        except RecordRejected as exc:
            out.results[index] = RecordResult(index=index, status="rejected", reason=str(exc))
            continue
        key = (kind, row["id"])
        if key in first:
            out.repeats[index] = first[key]
            continue
        first[key] = index
        out.rows[kind].append((index, row))
    return out


def prepare(device_id: str, records: list[Any], received_at: dt.datetime) -> Prepared:
    """Validate every record of a batch from ``device_id``; never raises on bad records."""
    return _prepare(records, lambda raw: validate_record(device_id, raw, received_at))


def prepare_checked(
    device_id: str, records: list[dict[str, Any]], received_at: dt.datetime
) -> Prepared:
    """:func:`prepare` for the records of a :func:`check_batch` result (ownership only)."""
    starts: dict[float, dt.datetime] = {}  # one datetime per interval start (see _utc)
    return _prepare(records, lambda raw: _checked_row(device_id, raw, received_at, starts))


def prepare_columns(
    device_id: str, columns: dict[str, list[Any]], offset: int, out: Prepared
) -> None:
    """Add the checked columns of a :func:`check_batch` result to ``out`` (ownership, repeats).

    Entry ``i`` is batch index ``offset + i``. An entry whose id is not ``<device_id>:
    <streams[i]>:...`` is rejected (the reasons of schema 1); a later copy of an id (also of an
    aggregate in ``out.rows``) is a repeat. The rest go to ``out.columns``.
    """
    ids: list[str] = columns["ids"]
    streams: list[str] = columns["streams"]
    n = len(ids)
    if not n:
        return
    starts_all: list[float] = columns["interval_start"]
    expected = [f"{device_id}:{s}:{round(t * 1000)}" for s, t in zip(streams, starts_all,
                                                                      strict=True)]
    owned = [rid == e or rid.startswith(e + ":") for rid, e in zip(ids, expected, strict=True)]
    first = {row["id"]: index for index, row in out.rows["aggregate"]}
    keep: list[int] | None = None  # None: every entry
    if not all(owned) or len(set(ids)) != n or not first.keys().isdisjoint(ids):
        keep = []
        for i, (rid, ok) in enumerate(zip(ids, owned, strict=True)):
            index = offset + i
            if not ok:
                try:
                    _check_owner(device_id, rid, device_id, streams[i],
                                 round(starts_all[i] * 1000))
                    reason = "id does not belong to this device and stream"
                except RecordRejected as exc:
                    reason = str(exc)
                out.results[index] = RecordResult(index=index, status="rejected", reason=reason)
            elif rid in first:
                out.repeats[index] = first[rid]
            else:
                first[rid] = index
                keep.append(i)

    def column(name: str) -> list[Any]:
        values = columns[name]
        return values if keep is None else [values[i] for i in keep]

    starts = column("interval_start")
    when = {s: dt.datetime.fromtimestamp(s, tz=dt.timezone.utc) for s in set(starts)}
    max_score = column("max_score")
    out.columns = AggregateColumnRows(
        indexes=list(range(offset, offset + n)) if keep is None else [offset + i for i in keep],
        ids=column("ids"),
        streams=column("streams"),
        interval_start=list(map(when.__getitem__, starts)),
        interval_s=list(map(float, column("interval_s"))),  # JSON may write 60 for 60.0
        count=column("count"),
        channels=column("channels"),
        max_score=[None if v is None else float(v) for v in max_score],
        windows=column("windows"),
        alert_count=column("alert_count"),
    )


def column_records(device_id: str, columns: RawColumns) -> list[Any]:
    """The slow path: each column entry as the schema-1 record it stands for (module docstring).

    ``channels[i]`` is parsed from its JSON text (left as it is when it is not a string of JSON,
    so the record fails validation with that reason).
    """
    out: list[Any] = []
    for (rid, stream, start, length, count, channels, max_score, windows, alerts) in zip(
        columns.ids, columns.streams, columns.interval_start, columns.interval_s,
        columns.count, columns.channels, columns.max_score, columns.windows,
        columns.alert_count, strict=True,
    ):
        out.append({"kind": "aggregate", "id": rid, "body": {
            "device_id": device_id, "stream": stream, "interval_start": start,
            "interval_s": length, "count": count, "channels": _parsed(channels),
            "max_score": max_score,
            "windows": windows, "alert_count": alerts,
        }})
    return out


def _parsed(channels: Any) -> Any:
    """A channels text parsed; anything else (not a string, not JSON) as it is."""
    if not isinstance(channels, str):
        return channels
    try:
        return json.loads(channels)
    except (ValueError, RecursionError):
        return channels  # "body.channels: Input should be a valid list"


class RecordRejected(ValueError):
    """One record is invalid; the message is the reason sent back to the device."""


def validate_record(
    device_id: str, raw: Any, received_at: dt.datetime
) -> tuple[Kind, dict[str, Any]]:
    """Turn one raw record into a table row.

    Args:
        device_id: The authenticated device; the record must belong to it.
        raw: The record as parsed from JSON.
        received_at: Stored as ``received_at`` (aware UTC).

    Returns:
        ``(kind, row)`` for the ``alerts`` or ``aggregates`` table.

    Raises:
        RecordRejected: Schema violation, non-finite number, foreign device, bad timestamp.
    """
    if not isinstance(raw, dict):
        raise RecordRejected("record must be a JSON object")
    try:
        record = _RECORD.validate_python(raw)
    except ValidationError as exc:
        raise RecordRejected(_reason(exc)) from None
    bad = unstorable(raw)  # after the schema check, so nesting depth is bounded
    if bad is not None:
        raise RecordRejected(bad)
    _check_owner(device_id, record.id, record.body.device_id, record.body.stream,
                 id_number(record.kind, record.body))
    if isinstance(record, AlertRecord):
        return "alert", _alert_row(record, received_at)
    return "aggregate", _aggregate_row(record, received_at)


def _check_owner(device_id: str, record_id: str, body_device: str, body_stream: str,
                 number: int | None = None) -> None:
    """Reject a record whose id (already matched against its pattern) or body names another
    device, whose id names another stream than its body, or whose id number is not the body's
    (``number``: an alert's ``body.seq``, an aggregate's ``body.interval_start`` in integer ms,
    :func:`id_number`). Ids are ``<device>:<stream>:<n>``, aggregates optionally with
    ``:<part>`` (:data:`cloud_sync.protocol.AGGREGATE_ID_PATTERN`). Without the number check a
    device could store a record under an id that its real record of that number later gets
    ``duplicate`` for.

    Raises:
        RecordRejected: With the reason sent back to the device.
    """
    owner, stream, n, *_ = record_id.split(":")
    if owner != device_id or body_device != device_id:
        raise RecordRejected(f"record belongs to another device (token is for {device_id!r})")
    if stream != body_stream:
        raise RecordRejected("id stream does not match body.stream")
    if number is not None and n != str(number):
        raise RecordRejected(f"id number {n} does not match the body ({number}: body.seq of an "
                             "alert, body.interval_start in ms of an aggregate)")


def id_number(kind: Kind, body: Any) -> int:
    """The number an id must carry: ``body.seq`` (alert), ``round(interval_start * 1000)``
    (aggregate; as the agent makes it, :meth:`agent.records.Aggregate.aggregate_id`)."""
    key = "seq" if kind == "alert" else "interval_start"
    value = body[key] if isinstance(body, dict) else getattr(body, key)
    return int(value) if kind == "alert" else round(float(value) * 1000)


def _checked_row(
    device_id: str, raw: dict[str, Any], received_at: dt.datetime,
    starts: dict[float, dt.datetime],
) -> tuple[Kind, dict[str, Any]]:
    """The row of a record :func:`check_batch` accepted (strict, storable, no NUL); ``starts``
    memoizes interval starts within the batch."""
    body = raw["body"]
    _check_owner(device_id, raw["id"], body["device_id"], body["stream"],
                 id_number(raw["kind"], body))
    if raw["kind"] == "alert":  # rare: the model path (timestamps parsed there)
        return "alert", _alert_row(AlertRecord.model_validate(raw, strict=True), received_at)
    return "aggregate", _aggregate_row_raw(raw, received_at, starts)


def _alert_row(record: AlertRecord, received_at: dt.datetime) -> dict[str, Any]:
    body = record.body
    if body.alert_id != record.id:
        raise RecordRejected("body.alert_id differs from id")
    if body.episode_id is not None and body.episode_id.split(":")[:2] != record.id.split(":")[:2]:
        raise RecordRejected("body.episode_id names another device or stream than id")
    return {
        "id": record.id,
        "device_id": body.device_id,
        "stream": body.stream,
        "seq": body.seq,
        "score": body.score,
        "threshold": body.threshold,
        "window_start": parse_utc(body.window_start, "body.window_start"),
        "window_end": parse_utc(body.window_end, "body.window_end"),
        "raised_at": parse_utc(body.raised_at, "body.raised_at"),
        "model_name": body.model.name,
        "model_version": body.model.version,
        # as sent: no "source": null (or "frame": null), no default "event" added
        "payload": body.model_dump(mode="json", by_alias=True, exclude_none=True,
                                   exclude_unset=True),
        "received_at": received_at,
    }


def _aggregate_row(record: AggregateRecord, received_at: dt.datetime) -> dict[str, Any]:
    body = record.body
    return {
        "id": record.id,
        "device_id": body.device_id,
        "stream": body.stream,
        "interval_start": dt.datetime.fromtimestamp(body.interval_start, tz=dt.timezone.utc),
        "interval_s": body.interval_s,
        "count": body.count,
        "channels": [c.model_dump(mode="json") for c in body.channels],
        "max_score": body.max_score,
        "windows": body.windows,
        "alert_count": body.alert_count,
        "received_at": received_at,
    }


def _aggregate_row_raw(
    raw: dict[str, Any], received_at: dt.datetime, starts: dict[float, dt.datetime]
) -> dict[str, Any]:
    """:func:`_aggregate_row` from a strictly validated raw record: no model instances.

    Strict validation guarantees exactly the schema's keys with values of the schema's kinds;
    JSON lets an integer stand for a float, so float columns go through ``float()``. A batch
    holds one aggregate per stream and interval, so streams of one interval share its start:
    ``starts`` (epoch seconds -> aware UTC) makes one datetime per distinct start, which the
    SQLite store then converts to text once (:class:`fleet.db.records.RecordStore`).
    """
    body = raw["body"]
    max_score = body["max_score"]
    start = body["interval_start"]
    when = starts.get(start)
    if when is None:
        when = starts[start] = dt.datetime.fromtimestamp(start, tz=dt.timezone.utc)
    return {
        "id": raw["id"],
        "device_id": body["device_id"],
        "stream": body["stream"],
        "interval_start": when,
        "interval_s": float(body["interval_s"]),
        "count": body["count"],
        "channels": body["channels"],
        "max_score": None if max_score is None else float(max_score),
        "windows": body["windows"],
        "alert_count": body["alert_count"],
        "received_at": received_at,
    }


def parse_utc(text: str, where: str = "timestamp") -> dt.datetime:
    """Parse an ISO 8601 timestamp with a UTC offset (``...Z`` or ``+00:00``) to aware UTC.

    Raises:
        RecordRejected: Not ISO 8601, or without a timezone.
    """
    try:
        value = fromisoformat(text)
    except ValueError:
        raise RecordRejected(f"{where}: not an ISO 8601 timestamp") from None
    if value.tzinfo is None:
        raise RecordRejected(f"{where}: timestamp without timezone (send UTC with Z)")
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:
        raise RecordRejected(f"{where}: out of range") from None


def unstorable(value: Any, path: str = "") -> str | None:
    """Why a JSON-shaped value cannot be stored as is, else ``None``.

    Catches what the schema lets through but a database refuses or mangles: NaN/Infinity (SQLite
    stores NULL, JSON has no such literal), integers outside int64 (BIGINT), NUL characters
    (PostgreSQL text/jsonb reject them) and lone surrogates (``"\\ud800"``: no UTF-8 for them).
    The answer never quotes a key that is itself unstorable.
    """
    where = path or "value"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where}: non-finite number (NaN/Infinity)"
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if _INT64_MIN <= value <= _INT64_MAX else f"{where}: integer out of range"
    if isinstance(value, str):
        if "\x00" in value:
            return f"{where}: NUL character"
        return None if value.isascii() or _utf8(value) else f"{where}: lone surrogate"
    if isinstance(value, dict):
        for key, item in value.items():
            found = unstorable(key, f"{where} (a key)")
            if found is None:
                found = unstorable(item, f"{path}.{key}" if path else key)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = unstorable(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reason(exc: ValidationError) -> str:
    """A short one-line summary of a pydantic error (first three problems)."""
    parts = [
        f"{'.'.join(str(p) for p in err['loc']) or 'record'}: {err['msg']}"
        for err in exc.errors(include_url=False, include_input=False)[:3]
    ]
    more = exc.error_count() - len(parts)
    text = "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
    return text[:_MAX_REASON].encode("utf-8", "backslashreplace").decode("utf-8")
