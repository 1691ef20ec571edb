"""Operator-side request/response bodies of the registry and rollouts (admin token).

The device-side bodies are :mod:`cloud_sync.protocol` (ModelAssignment, ModelStatusReport).
Times are ISO 8601 UTC.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cloud_sync.protocol import INT64_MAX, NAME_PATTERN, STREAM_PATTERN, TEXT_PATTERN


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelOut(_Body):
    """A stored package (``GET /v1/models``, ``POST /v1/models``)."""

    name: str
    version: int
    archive_sha256: str
    size: int = Field(description="Archive size, bytes.")
    key_id: str = Field(description="Key id that signed the manifest.")
    description: str
    uploaded_at: dt.datetime
    uploaded_by: str
    corrupt: str | None = Field(
        None, description="Why the stored archive is unusable (it no longer matches "
        "archive_sha256: downloads are refused with HTTP 500 corrupt_archive); push the "
        "package again. None while it is sound.")


class ModelList(_Body):
    models: list[ModelOut]


class RolloutCreate(_Body):
    """``POST /v1/rollouts``: exactly one of ``tag`` or ``devices``."""

    name: str = Field(pattern=NAME_PATTERN, description="Model package name (in the registry).")
    version: int = Field(ge=1, le=INT64_MAX, description="Model package version.")
    tag: str | None = Field(
        None, min_length=1, max_length=64, pattern=TEXT_PATTERN,
        description="Every active device with it.",
    )
    devices: list[Annotated[str, Field(pattern=NAME_PATTERN)]] | None = Field(
        None, min_length=1, max_length=10_000, description="These devices (at most 10,000)."
    )
    stream: str | None = Field(None, pattern=STREAM_PATTERN, description="None: every stream.")
    canary_percent: float | None = Field(
        None, gt=0, le=100, description="None or 100: every device at once (promoted)."
    )
    halt_after_failures: int | None = Field(
        None, ge=1, le=1_000_000,
        description="Failed devices that halt it (default: the server's, 1).",
    )

    @model_validator(mode="after")
    def _one_target(self) -> RolloutCreate:
        if (self.tag is None) == (self.devices is None):
            raise ValueError("give exactly one of 'tag' or 'devices'")
        return self


class RolloutDeviceOut(_Body):
    device_id: str
    canary: bool
    assigned: bool
    previous_version: int | None
    state: str | None = Field(description="Last reported ModelState, None before any report.")
    version: int | None = Field(
        None, description="Version the last report of this rollout names (its ``state`` is "
        "of that version: shadow of the rollout's version, or active on the one it went back "
        "to); None before any report.")
    reason: str | None
    reported_at: dt.datetime | None


class RolloutOut(_Body):
    id: int
    name: str
    version: int
    target_tag: str | None
    target_devices: list[str]
    stream: str | None
    canary_percent: float | None
    halt_after_failures: int
    state: str
    reason: str | None = Field(description="Why it was halted (or aborted), if it was.")
    created_at: dt.datetime
    updated_at: dt.datetime
    counts: dict[str, int] = Field(description="Devices per last reported state ('none').")
    devices: list[RolloutDeviceOut] = Field(default_factory=list)
    can_roll_back: bool = Field(
        False, description="The fleet holds a rollback key (--rollback-key): an abort sends "
        "devices already active on the version back to their previous one; without it they "
        "keep it (devices not yet active on it are stopped either way).")
    superseded_by: int | None = Field(
        None, description="A newer rollout of the same stream (or of every stream) that all "
        "its devices follow now (when they follow several, the oldest of them); None while "
        "any device still follows this one.")
    model_corrupt: str | None = Field(
        None, description="Why the rolled-out package's stored archive is unusable (devices "
        "cannot download it: HTTP 500 corrupt_archive); push the package again. None while it "
        "is sound.")
    actions: list[str] = Field(
        default_factory=list, description="The operator actions the fleet accepts now "
        "(promote, pause, resume, abort; none once aborted or superseded).")

    def summary(self) -> dict[str, Any]:
        """Without the per-device list."""
        return self.model_dump(mode="json", exclude={"devices"})


class RolloutList(_Body):
    rollouts: list[RolloutOut]
