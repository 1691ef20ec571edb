"""The model-loop services of a running app (registry, rollouts) and their request dependency.

Kept apart from :class:`fleet.api.deps.Services` so the registry can be wired (and left out) on
its own: :func:`fleet.app.create_app` stores a :class:`ModelLoop` in ``app.state.model_loop``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from fleet.registry.rollouts import RolloutService
from fleet.registry.store import ModelRegistry

#: Largest package upload accepted, bytes (compressed archive).
MAX_UPLOAD_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ModelLoop:
    """Registry and rollouts of one app."""

    registry: ModelRegistry
    rollouts: RolloutService
    max_upload_bytes: int = MAX_UPLOAD_BYTES


async def get_model_loop(request: Request) -> ModelLoop:
    """The app's :class:`ModelLoop` (``async``: FastAPI runs a plain ``def`` dependency in the
    thread pool, one thread hand-off per request, e.g. per assignment poll)."""
    loop = request.app.state.model_loop
    assert isinstance(loop, ModelLoop)
    return loop


ModelLoopDep = Annotated[ModelLoop, Depends(get_model_loop)]
