"""``POST /v1/ingest``: a device uploads alerts and aggregates (see :mod:`cloud_sync.protocol`).

Steps: authenticate the device token (401/403) before reading the body; read it within the
limits of :mod:`fleet.api.body` (400/413/415); validate the envelope (422; 413 past
``MAX_BATCH_RECORDS``); 403 when ``device_id`` is not the token's device; then validate each
record alone and store the valid ones in one transaction (:meth:`fleet.db.records.RecordStore.
ingest`). The 200 answer gives one :class:`~cloud_sync.protocol.RecordResult` per index.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from cloud_sync.protocol import MAX_BATCH_RECORDS, MAX_BODY_BYTES, IngestResult, RecordResult
from fleet.api.body import read_json
from fleet.api.deps import DeviceDep, Services, ServicesDep
from fleet.db.devices import utcnow
from fleet.db.records import DeviceReport
from fleet.errors import ApiError, Forbidden, PayloadTooLarge, Unprocessable
from fleet.ingest import Envelope, prepare, unstorable

router = APIRouter()


@router.post("/v1/ingest", response_model=IngestResult)
async def ingest(request: Request, device_id: DeviceDep, services: ServicesDep) -> IngestResult:
    try:
        data = await read_json(request, MAX_BODY_BYTES)
        envelope = _envelope(data, device_id)
        result = await run_in_threadpool(_store, services, device_id, envelope)
    except ApiError as exc:
        services.metrics.ingest_batches.labels(exc.code).inc()
        raise
    services.metrics.ingest_batches.labels("ok").inc()
    return result


def _envelope(data: Any, device_id: str) -> Envelope:
    records = data.get("records") if isinstance(data, dict) else None
    if isinstance(records, list) and len(records) > MAX_BATCH_RECORDS:
        raise PayloadTooLarge(
            f"batch of {len(records)} records is over the {MAX_BATCH_RECORDS}-record limit"
        )
    try:
        envelope = Envelope.model_validate(data)
    except ValidationError as exc:
        raise Unprocessable([
            {"loc": list(err["loc"]), "msg": err["msg"]}
            for err in exc.errors(include_url=False, include_input=False)[:20]
        ]) from None
    bad = unstorable(envelope.model_dump(exclude={"records"}))
    if bad is not None:
        raise Unprocessable(bad)
    if envelope.device_id != device_id:
        raise Forbidden(f"batch device_id {envelope.device_id!r} is not the token's device")
    return envelope


def _store(services: Services, device_id: str, envelope: Envelope) -> IngestResult:
    now = utcnow()
    prepared = prepare(device_id, envelope.records, now)
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
    new = services.records.ingest(device_id, report, rows, now)
    results = dict(prepared.results)
    for kind, items in prepared.rows.items():
        for index, row in items:
            status = "accepted" if (kind, row["id"]) in new else "duplicate"
            results[index] = RecordResult(index=index, status=status)
    for index in prepared.repeats:
        results[index] = RecordResult(index=index, status="duplicate")
    ordered = [results[i] for i in range(len(envelope.records))]
    _count(services, envelope.records, ordered)
    return IngestResult(results=ordered)


def _count(services: Services, records: list[Any], results: list[RecordResult]) -> None:
    tally: dict[tuple[str, str], int] = {}
    for raw, res in zip(records, results, strict=True):
        kind = raw.get("kind") if isinstance(raw, dict) else None
        label = kind if kind in ("alert", "aggregate") else "unknown"
        tally[(label, res.status)] = tally.get((label, res.status), 0) + 1
    for (kind, status), n in tally.items():
        services.metrics.ingest_records.labels(kind, status).inc(n)


