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
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from cloud_sync.protocol import (
    MAX_BATCH_RECORDS,
    AggregateRecord,
    AlertRecord,
    IngestBatch,
    RecordResult,
)
from fleet.checker import checker

Kind = Literal["alert", "aggregate"]
_MAX_REASON = 300
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_RECORD = TypeAdapter[AlertRecord | AggregateRecord](
    Annotated[AlertRecord | AggregateRecord, Field(discriminator="kind")]
)


class Envelope(IngestBatch):
    """An :class:`~cloud_sync.protocol.IngestBatch` whose records are not validated yet."""

    records: list[Any] = Field(max_length=MAX_BATCH_RECORDS)


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
    ``device_id``, ``sent_at``, ``agent_version``, ``model``, ``backlog``, ``records``).
    """
    if b"\\u0000" in data:
        return None
    try:
        checked: dict[str, Any] = _BATCH.validate_json(data, strict=True)
    except ValidationError:
        return None
    return checked


@dataclass
class Prepared:
    """A batch after per-record validation.

    Attributes:
        rows: ``kind -> [(index, row dict for the table)]``, first copy of each id only.
        results: Index -> result, filled for rejected records and in-batch repeats.
        repeats: Index of a later copy -> index of the first copy with the same ``(kind, id)``.
    """

    rows: dict[Kind, list[tuple[int, dict[str, Any]]]] = field(
        default_factory=lambda: {"alert": [], "aggregate": []}
    )
    results: dict[int, RecordResult] = field(default_factory=dict)
    repeats: dict[int, int] = field(default_factory=dict)


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
    _check_owner(device_id, record.id, record.body.device_id, record.body.stream)
    if isinstance(record, AlertRecord):
        return "alert", _alert_row(record, received_at)
    return "aggregate", _aggregate_row(record, received_at)


def _check_owner(device_id: str, record_id: str, body_device: str, body_stream: str) -> None:
    owner, stream, _ = record_id.split(":")
    if owner != device_id or body_device != device_id:
        raise RecordRejected(f"record belongs to another device (token is for {device_id!r})")
    if stream != body_stream:
        raise RecordRejected("id stream does not match body.stream")


def _checked_row(
    device_id: str, raw: dict[str, Any], received_at: dt.datetime,
    starts: dict[float, dt.datetime],
) -> tuple[Kind, dict[str, Any]]:
    """The row of a record :func:`check_batch` accepted (strict, storable, no NUL); ``starts``
    memoizes interval starts within the batch."""
    body = raw["body"]
    _check_owner(device_id, raw["id"], body["device_id"], body["stream"])
    if raw["kind"] == "alert":  # rare: the model path (timestamps parsed there)
        return "alert", _alert_row(AlertRecord.model_validate(raw, strict=True), received_at)
    return "aggregate", _aggregate_row_raw(raw, received_at, starts)


def _alert_row(record: AlertRecord, received_at: dt.datetime) -> dict[str, Any]:
    body = record.body
    if body.alert_id != record.id:
        raise RecordRejected("body.alert_id differs from id")
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
        "payload": body.model_dump(mode="json", by_alias=True),
        "received_at": received_at,
    }


def _aggregate_row(record: AggregateRecord, received_at: dt.datetime) -> dict[str, Any]:
    body = record.body
    return {
        "id": record.id,
        "device_id": body.device_id,
        "stream": body.stream,
        "interval_start": dt.datetime.fromtimestamp(body.interval_start, tz=dt.UTC),
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
        when = starts[start] = dt.datetime.fromtimestamp(start, tz=dt.UTC)
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
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise RecordRejected(f"{where}: not an ISO 8601 timestamp") from None
    if value.tzinfo is None:
        raise RecordRejected(f"{where}: timestamp without timezone (send UTC with Z)")
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise RecordRejected(f"{where}: out of range") from None


def unstorable(value: Any, path: str = "") -> str | None:
    """Why a JSON-shaped value cannot be stored as is, else ``None``.

    Catches what the schema lets through but a database refuses or mangles: NaN/Infinity (SQLite
    stores NULL, JSON has no such literal), integers outside int64 (BIGINT) and NUL characters
    (PostgreSQL text/jsonb reject them).
    """
    where = path or "value"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where}: non-finite number (NaN/Infinity)"
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if _INT64_MIN <= value <= _INT64_MAX else f"{where}: integer out of range"
    if isinstance(value, str):
        return f"{where}: NUL character" if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = unstorable(key, where) or unstorable(item, f"{path}.{key}" if path else key)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = unstorable(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _reason(exc: ValidationError) -> str:
    """A short one-line summary of a pydantic error (first three problems)."""
    parts = [
        f"{'.'.join(str(p) for p in err['loc']) or 'record'}: {err['msg']}"
        for err in exc.errors(include_url=False, include_input=False)[:3]
    ]
    more = exc.error_count() - len(parts)
    text = "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
    return text[:_MAX_REASON]
