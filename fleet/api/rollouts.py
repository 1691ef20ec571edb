"""Rollout routes (operator) and the device side of the model loop.

Operator (admin token):

* ``POST /v1/rollouts`` (:class:`~fleet.registry.views.RolloutCreate`) → 201 RolloutOut; 404
  unknown package; 422 empty target, unknown devices or a bad body.
* ``GET /v1/rollouts`` → RolloutList (newest first, no per-device rows);
  ``GET /v1/rollouts/{id}`` → RolloutOut with per-device states.
* ``POST /v1/rollouts/{id}/promote|pause|resume|abort`` → RolloutOut; 409 when the action is
  not allowed in the current state (see :mod:`fleet.registry.policy`).

Device (device token):

* ``GET /v1/models/assignment?stream=S`` → 200 :class:`~cloud_sync.protocol.ModelAssignment`,
  or 204 (keep the installed model).
* ``POST /v1/models/status`` (:class:`~cloud_sync.protocol.ModelStatusReport`) → 204; 403 when
  it names another device or a rollout the device is not in; 404 unknown rollout.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from pydantic import ValidationError

from cloud_sync.protocol import STREAM_PATTERN, ModelAssignment, ModelStatusReport
from fleet.api.deps import AdminDep, DeviceDep
from fleet.api.model_loop import ModelLoopDep
from fleet.errors import Unprocessable
from fleet.registry.views import RolloutCreate, RolloutList, RolloutOut

router = APIRouter()


def _parse(model: Any, body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise Unprocessable(
            [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        ) from None


@router.post("/v1/rollouts", status_code=201, response_model=RolloutOut)
def create(body: dict[str, Any], loop: ModelLoopDep, _admin: AdminDep) -> RolloutOut:
    req: RolloutCreate = _parse(RolloutCreate, body)
    return loop.rollouts.create(req)


@router.get("/v1/rollouts", response_model=RolloutList)
def list_rollouts(loop: ModelLoopDep, _admin: AdminDep) -> RolloutList:
    return RolloutList(rollouts=loop.rollouts.list())


@router.get("/v1/rollouts/{rollout_id}", response_model=RolloutOut)
def show(rollout_id: int, loop: ModelLoopDep, _admin: AdminDep) -> RolloutOut:
    return loop.rollouts.get(rollout_id)


@router.post("/v1/rollouts/{rollout_id}/{action}", response_model=RolloutOut)
def act(
    rollout_id: int,
    action: Literal["promote", "pause", "resume", "abort"],
    loop: ModelLoopDep,
    _admin: AdminDep,
) -> RolloutOut:
    return loop.rollouts.act(rollout_id, action)


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


@router.post("/v1/models/status", status_code=204)
def status(body: dict[str, Any], loop: ModelLoopDep, device_id: DeviceDep) -> Response:
    rep: ModelStatusReport = _parse(ModelStatusReport, body)
    loop.rollouts.report(device_id, rep)
    return Response(status_code=204)
