"""Rollout routes (operator) and the device side of the model loop.

Operator (reads: viewer; create and actions: operator, recorded in the audit log with
:func:`audit_detail`):

* ``POST /v1/rollouts`` (:class:`~fleet.registry.views.RolloutCreate`) → 201 RolloutOut; 404
  unknown package; 422 empty target, unknown devices or a bad body.
* ``GET /v1/rollouts`` → RolloutList (newest first, no per-device rows);
  ``GET /v1/rollouts/{id}`` → RolloutOut with per-device states.
* ``POST /v1/rollouts/{id}/promote|pause|resume|abort[?expected_state=S]`` → RolloutOut; 409
  when the action is not allowed in the current state (see :mod:`fleet.registry.policy`), or the
  rollout is no longer in ``expected_state`` (the state the operator saw: another operator, on
  any replica, acted first; see :meth:`fleet.registry.rollouts.RolloutService.act`).

Device (device token):

* ``GET /v1/models/assignment?stream=S`` → 200 :class:`~cloud_sync.protocol.ModelAssignment`,
  or 204 (keep the installed model).
* ``POST /v1/models/status`` (:class:`~cloud_sync.protocol.ModelStatusReport`) → 204; 403 when
  it names another device or a rollout the device is not in; 404 unknown rollout.

Both bodies are read only after the token is checked, within 1 MiB (rollouts) and 64 KiB
(status reports): :mod:`fleet.api.json_body`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from cloud_sync.protocol import (
    INT64_MAX,
    STREAM_PATTERN,
    ModelAssignment,
    ModelStatusReport,
)
from fleet.api.auditing import arecord, record
from fleet.api.deps import DeviceDep, OperatorDep, ViewerDep
from fleet.api.json_body import (
    NO_BODY,
    ROLLOUT_MAX_BYTES,
    STATUS_MAX_BYTES,
    body_doc,
    read_model,
)
from fleet.api.model_loop import ModelLoopDep
from fleet.registry.policy import RolloutState
from fleet.registry.views import RolloutCreate, RolloutList, RolloutOut

router = APIRouter()


RolloutId = Annotated[int, Path(ge=1, le=INT64_MAX)]


@router.post("/v1/rollouts", status_code=201, response_model=RolloutOut,
             openapi_extra=body_doc(RolloutCreate))
async def create(request: Request, loop: ModelLoopDep, who: OperatorDep) -> RolloutOut:
    req = await read_model(request, RolloutCreate, ROLLOUT_MAX_BYTES)  # after the token check
    out = await run_in_threadpool(loop.rollouts.create, req)
    await arecord(request, who, "rollout.create", str(out.id), audit_detail(out))
    return out


@router.get("/v1/rollouts", response_model=RolloutList)
def list_rollouts(loop: ModelLoopDep, _viewer: ViewerDep) -> RolloutList:
    return RolloutList(rollouts=loop.rollouts.list())


@router.get("/v1/rollouts/{rollout_id}", response_model=RolloutOut)
def show(rollout_id: RolloutId, loop: ModelLoopDep, _viewer: ViewerDep) -> RolloutOut:
    return loop.rollouts.get(rollout_id)


@router.post("/v1/rollouts/{rollout_id}/{action}", response_model=RolloutOut,
             openapi_extra=NO_BODY)
def act(
    rollout_id: RolloutId,
    action: Literal["promote", "pause", "resume", "abort"],
    loop: ModelLoopDep,
    request: Request,
    who: OperatorDep,
    expected_state: Annotated[RolloutState | None, Query(
        description="refuse (409) unless the rollout is in this state")] = None,
) -> RolloutOut:
    out = loop.rollouts.act(rollout_id, action, expected_state)
    record(request, who, f"rollout.{action}", str(rollout_id), audit_detail(out))
    return out


#: Device ids an audit entry names at most (a rollout may target 10,000).
AUDIT_MAX_DEVICES = 20


def audit_detail(out: RolloutOut) -> dict[str, Any]:
    """What a ``rollout.*`` audit entry records: rollout id, ``model`` (``name@version``),
    ``stream`` (``*``: every stream), the target (``tag``, or up to :data:`AUDIT_MAX_DEVICES`
    ``devices``; ``device_count`` either way), canary percent, halt threshold, the state after
    the action and, when there is one, the rollout's ``reason`` (an abort's outcome)."""
    detail: dict[str, Any] = {
        "rollout": out.id, "model": f"{out.name}@{out.version}", "stream": out.stream or "*",
    }
    if out.target_tag is not None:
        detail["tag"] = out.target_tag
    else:
        detail["devices"] = out.target_devices[:AUDIT_MAX_DEVICES]
    detail.update(device_count=len(out.target_devices), canary_percent=out.canary_percent,
                  halt_after_failures=out.halt_after_failures, state=out.state)
    if out.reason:
        detail["reason"] = out.reason
    return detail


@router.get("/v1/models/assignment", response_model=ModelAssignment)
def assignment(
    loop: ModelLoopDep,
    device_id: DeviceDep,
    stream: Annotated[str | None, Query(pattern=STREAM_PATTERN)] = None,
) -> Any:
    found = loop.rollouts.assignment(device_id, stream)
    if found is None:
        return Response(status_code=204)
    return found


@router.post("/v1/models/status", status_code=204, openapi_extra=body_doc(ModelStatusReport))
async def status(request: Request, loop: ModelLoopDep, device_id: DeviceDep) -> Response:
    rep = await read_model(request, ModelStatusReport, STATUS_MAX_BYTES)  # after the token
    await run_in_threadpool(loop.rollouts.report, device_id, rep)
    return Response(status_code=204)
