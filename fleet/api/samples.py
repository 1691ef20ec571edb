"""``POST /v1/samples``: a device uploads raw windows for retraining (see
:mod:`cloud_sync.protocol`, :class:`~cloud_sync.protocol.SampleBatch`).

Steps: authenticate the device token (401/403) before reading the body; read it within
``MAX_BODY_BYTES`` (gzip like ingest; 400/413/415); validate the batch (422); 403 when
``device_id`` is not the token's device; check the shape: every window ``W × C`` with C =
``len(channels)``, finite values, a ``calibration`` batch holding exactly one block of N ≥ 2
readings, and at most :data:`MAX_SAMPLE_VALUES` numbers in all (413); store it
(:class:`fleet.db.samples.SampleStore`). Answer 200 ``{"stored": <windows>}``.

After a ``calibration`` batch is stored the app's ``on_calibration`` hook (``serve
--auto-retrain``: enqueue a retraining job, :mod:`fleet.jobs.queue`) is called with
``(device_id, stream)`` in the thread pool; it only enqueues work.
"""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from cloud_sync.protocol import MAX_BODY_BYTES, SampleBatch
from fleet.api.deps import DeviceDep, ServicesDep
from fleet.api.json_body import body_doc, read_model
from fleet.db.devices import utcnow
from fleet.errors import Forbidden, PayloadTooLarge, Unprocessable

router = APIRouter()

#: Most numbers one batch may carry (a 400 × 8 calibration block is 3,200).
MAX_SAMPLE_VALUES = 1_000_000


@router.post("/v1/samples", openapi_extra=body_doc(SampleBatch))
async def post_samples(
    request: Request, device_id: DeviceDep, services: ServicesDep
) -> dict[str, int]:
    batch = await read_model(request, SampleBatch, MAX_BODY_BYTES)
    if batch.device_id != device_id:
        raise Forbidden(f"batch device_id {batch.device_id!r} is not the token's device")
    check_shape(batch)
    store = services.samples
    if store is None:
        raise Unprocessable("this fleet does not store samples")
    stored = await run_in_threadpool(store.add, batch, utcnow())
    if batch.kind == "calibration" and services.on_calibration is not None:
        await run_in_threadpool(services.on_calibration, batch.device_id, batch.stream)
    return {"stored": stored}


def check_shape(batch: SampleBatch) -> None:
    """Check the windows' shape and values.

    Raises:
        PayloadTooLarge: more than :data:`MAX_SAMPLE_VALUES` numbers.
        Unprocessable: ragged windows, a channel count mismatch, a non-finite value, or a
            calibration batch that is not one block of at least 2 readings.
    """
    c = len(batch.channels)
    if len(set(batch.channels)) != c:
        raise Unprocessable("channel names repeat")
    if not batch.windows:
        raise Unprocessable("no windows")
    w = len(batch.windows[0])
    total = len(batch.windows) * w * c
    if total > MAX_SAMPLE_VALUES:
        raise PayloadTooLarge(f"{total} values is over the {MAX_SAMPLE_VALUES}-value limit")
    if batch.kind == "calibration" and (len(batch.windows) != 1 or w < 2):
        raise Unprocessable("a calibration batch holds exactly one block of N >= 2 readings")
    for i, win in enumerate(batch.windows):
        if len(win) != w or any(len(row) != c for row in win):
            raise Unprocessable(f"window {i} is not {w} x {c} (channels: {c})")
        if not all(math.isfinite(v) for row in win for v in row):
            raise Unprocessable(f"window {i} holds a non-finite value")
