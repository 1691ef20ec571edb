"""``POST /v1/ingest``: a device uploads alerts and aggregates (see :mod:`cloud_sync.protocol`).

Steps: authenticate the device token (401/403) before reading the body; read it within the
limits of :mod:`fleet.api.body` (400/413/415); validate the envelope (422; 413 past
``MAX_BATCH_RECORDS``); 403 when ``device_id`` is not the token's device; then validate each
record alone and store the valid ones in one transaction (:meth:`fleet.db.records.RecordStore.
ingest`). The 200 answer gives one :class:`~cloud_sync.protocol.RecordResult` per index. Schema
2 batches carry aggregates as columns after ``records`` (indexes continue there; 422 for columns
of unequal lengths or in a schema-1 batch, 413 past ``MAX_BATCH_RECORDS`` in all; see
:mod:`fleet.ingest`).

Cost per request matters (200 gateways, or a 5,000-record backlog batch): the body bytes first
try the one-call check of :mod:`fleet.ingest` (parse + validate in one pass, off the event loop,
like the rest of the work), and the answer is serialized straight to JSON bytes
(``pydantic_core.to_json``) instead of through 5,000 ``RecordResult`` models and FastAPI's
re-validation of the response model (the OpenAPI schema still says :class:`IngestResult`).

Spreading one device's connections over worker processes (``edge-fleet serve --workers N``): a
gateway draining a backlog keeps ``max_in_flight`` keep-alive connections open, and a connection
stays with the worker that accepted it. Connections opened while only one worker was ready (a
fleet that just started) all land in that worker, which then does their work alone while the
others idle. So when an ingest answer is ready while another ingest of the same device is still
in progress in this process, the answer carries ``Connection: close``: the device opens a new
connection for its next request (the response itself is complete; nothing is retried), which
the least busy worker is the likeliest to accept. A device with one connection per worker, or
with one request at a time, never sees it.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from pydantic_core import to_json
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from cloud_sync.protocol import MAX_BATCH_RECORDS, MAX_BODY_BYTES, IngestBatch, IngestResult
from fleet.api.body import parse_json, read_body
from fleet.api.deps import DeviceDep, Services, ServicesDep
from fleet.api.json_body import body_doc
from fleet.db.devices import utcnow
from fleet.db.records import DeviceReport
from fleet.errors import ApiError, Forbidden, PayloadTooLarge, Unprocessable
from fleet.events import Events
from fleet.ingest import (
    ColumnsInvalid,
    Envelope,
    check_batch,
    check_columns,
    column_records,
    prepare,
    prepare_checked,
    prepare_columns,
    unstorable,
)

router = APIRouter()
_log = logging.getLogger(__name__)


@router.post("/v1/ingest", response_model=IngestResult, openapi_extra=body_doc(IngestBatch))
async def ingest(request: Request, device_id: DeviceDep, services: ServicesDep) -> Response:
    ingesting = services.ingesting
    ingesting[device_id] += 1
    try:
        data = await read_body(request, MAX_BODY_BYTES)
        result = await run_in_threadpool(_store, services, device_id, data)
    except ApiError as exc:
        services.metrics.ingest_batches.labels(exc.code).inc()
        raise
    finally:
        ingesting[device_id] -= 1
        if not ingesting[device_id]:
            del ingesting[device_id]
    services.metrics.ingest_batches.labels("ok").inc()
    # Another request of this device is being served here: move this connection (docstring).
    headers = {"Connection": "close"} if device_id in ingesting else None
    return Response(to_json({"results": result}), media_type="application/json", headers=headers)


def _envelope(data: Any, device_id: str) -> tuple[Envelope, list[Any]]:
    """The envelope and every record (schema-2 columns as records after ``records``)."""
    records = data.get("records") if isinstance(data, dict) else None
    if isinstance(records, list) and len(records) > MAX_BATCH_RECORDS:
        raise PayloadTooLarge(
            f"batch of {len(records)} records is over the {MAX_BATCH_RECORDS}-record limit"
        )
    columns = data.get("aggregates") if isinstance(data, dict) else None
    if isinstance(columns, dict):
        for name, values in columns.items():
            if isinstance(values, list) and len(values) > MAX_BATCH_RECORDS:
                raise PayloadTooLarge(
                    f"aggregates.{name}: {len(values)} entries is over the "
                    f"{MAX_BATCH_RECORDS}-record limit"
                )
    try:
        envelope = Envelope.model_validate(data)
    except ValidationError as exc:
        raise Unprocessable([
            {"loc": list(err["loc"]), "msg": err["msg"]}
            for err in exc.errors(include_url=False, include_input=False)[:20]
        ]) from None
    bad = unstorable(envelope.model_dump(exclude={"records", "aggregates"}))
    if bad is not None:
        raise Unprocessable(bad)
    if envelope.device_id != device_id:
        raise wrong_device(envelope.device_id, device_id)
    raw = envelope.aggregates
    try:
        check_columns(
            envelope.schema_, len(envelope.records), None if raw is None else raw.model_dump()
        )
    except ColumnsInvalid as exc:
        if exc.status == 413:
            raise PayloadTooLarge(str(exc)) from None
        raise Unprocessable(str(exc)) from None
    extra = [] if raw is None else column_records(device_id, raw)
    return envelope, envelope.records + extra


def wrong_device(sent: str, enrolled: str) -> Forbidden:
    """The 403 of a batch whose ``device_id`` is not the token's device: names both ids and
    says which to change (re-enrolling does not help: the token is valid)."""
    return Forbidden(
        f"batch device_id {sent[:64]!r} is not this token's device {enrolled!r}: the agent's "
        f"[agent] device_id must be the enrolled device name; set device_id = {enrolled!r} in "
        f"the agent's config (or enroll a device named {sent[:64]!r} and use its token)"
    )


def _store(services: Services, device_id: str, data: bytes) -> list[dict[str, Any]]:
    """Validate and store a batch; return its :class:`IngestResult` ``results`` as dicts."""
    now = utcnow()
    checked = check_batch(data)
    if checked is not None:
        if checked["device_id"] != device_id:
            raise wrong_device(str(checked["device_id"]), device_id)
        records: list[Any] = checked["records"]
        prepared = prepare_checked(device_id, records, now)
        columns = checked["aggregates"]
        n_columns = 0
        if columns is not None:
            n_columns = len(columns["ids"])
            prepare_columns(device_id, columns, len(records), prepared)
        model = checked["model"]
        report = DeviceReport(
            agent_version=checked["agent_version"],
            model_name=model["name"] if model else None,
            model_version=model["version"] if model else None,
            backlog_alerts=checked["backlog"]["alerts"],
            backlog_aggregates=checked["backlog"]["aggregates"],
        )
    else:
        envelope, records = _envelope(parse_json(data), device_id)
        n_columns = 0  # the columns' entries are records here
        prepared = prepare(device_id, records, now)
        report = DeviceReport(
            agent_version=envelope.agent_version,
            model_name=envelope.model.name if envelope.model else None,
            model_version=envelope.model.version if envelope.model else None,
            backlog_alerts=envelope.backlog.alerts,
            backlog_aggregates=envelope.backlog.aggregates,
        )
    rows: dict[str, list[dict[str, Any]]] = {
        kind: [row for _, row in items] for kind, items in prepared.rows.items()
    }
    cols = prepared.columns
    new = services.records.ingest(device_id, report, rows, now, cols)
    if services.events is not None:
        _alert_event(services, services.events, device_id,
                     [row for row in rows.get("alert", []) if ("alert", row["id"]) in new])
    results: dict[int, dict[str, Any]] = {
        i: r.model_dump(exclude_none=True) for i, r in prepared.results.items()
    }
    for kind, items in prepared.rows.items():
        for index, row in items:
            status = "accepted" if (kind, row["id"]) in new else "duplicate"
            results[index] = {"index": index, "status": status}
    if cols is not None:
        accepted = [("aggregate", rid) in new for rid in cols.ids]
        for index, fresh in zip(cols.indexes, accepted, strict=True):
            results[index] = {"index": index, "status": "accepted" if fresh else "duplicate"}
    for index in prepared.repeats:
        results[index] = {"index": index, "status": "duplicate"}
    ordered = [results[i] for i in range(len(records) + n_columns)]
    _count(services, records, ordered)
    return ordered


def _alert_event(services: Services, events: Events, device_id: str,
                 fresh: list[dict[str, Any]]) -> None:
    """Queue the batch's ``alert`` webhook event (:mod:`fleet.events`); the batch is stored
    already, so a failure here is logged and counted, never the device's error."""
    try:
        events.alerts(device_id, fresh)
    except SQLAlchemyError as exc:
        services.metrics.webhook_events_dropped.labels("alert").inc()
        _log.warning("alert webhook event of %s not queued: %s", device_id, exc)


def _count(services: Services, records: list[Any], results: list[dict[str, Any]]) -> None:
    """Count results by kind and status (results past ``records`` are column aggregates)."""
    tally: dict[tuple[str, str], int] = {}
    for raw, res in zip(records, results, strict=False):
        kind = raw.get("kind") if isinstance(raw, dict) else None
        label = kind if kind in ("alert", "aggregate") else "unknown"
        key = (label, res["status"])
        tally[key] = tally.get(key, 0) + 1
    for res in results[len(records):]:
        key = ("aggregate", res["status"])
        tally[key] = tally.get(key, 0) + 1
    for (kind, status), n in tally.items():
        services.metrics.ingest_records.labels(kind, status).inc(n)


