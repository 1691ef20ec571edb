"""Wire schema of a device's health summary: ``POST /v1/devices/self/health``.

The agent sends its ``/healthz`` report in short (:class:`HealthSummary`) at least every
``fleet.health_interval_s`` (default 60 s) with the device token; the fleet keeps the latest per
device, answers 204, and marks the device ``offline`` after ``edge-fleet serve --offline-after``
seconds without a health report or an upload. A fleet older than this route answers 404 or 405:
the agent then stops sending health for an hour and uploads as before.

Everything is bounded: at most :data:`MAX_STREAMS` streams and :data:`MAX_MODELS` models, names
as :data:`cloud_sync.protocol.NAME_PATTERN`, reasons up to :data:`MAX_REASON` characters, counts
as int64, and the whole body at most :data:`HEALTH_MAX_BYTES`. Unknown fields are refused (422).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from cloud_sync.protocol import INT64_MAX, NAME_PATTERN, TEXT_PATTERN

HEALTH_PATH = "/v1/devices/self/health"
#: Largest health body the fleet reads, bytes.
HEALTH_MAX_BYTES = 64 * 1024
MAX_STREAMS, MAX_MODELS, MAX_REASON = 64, 64, 256

Status = Literal["green", "yellow", "red"]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamHealth(_Wire):
    """One stream's source as ``/healthz`` reports it."""

    stream: str = Field(pattern=NAME_PATTERN, description="Stream name.")
    state: Status = Field(description="green, yellow or red (the source component's state).")
    reason: str | None = Field(
        None, max_length=MAX_REASON, pattern=TEXT_PATTERN,
        description="Why the state is not green.",
    )


class ModelHealth(_Wire):
    """The model a stream runs."""

    stream: str = Field(pattern=NAME_PATTERN, description="Stream name.")
    name: str = Field(min_length=1, max_length=64, pattern=TEXT_PATTERN,
                      description="Model package name.")
    version: int = Field(ge=0, le=INT64_MAX, description="Model package version.")


class DiskUse(_Wire):
    """The agent store's disk use."""

    used_bytes: Count = Field(description="Bytes the store takes.")
    budget_bytes: Count | None = Field(None, description="The store's budget, bytes, if set.")


class HealthSummary(_Wire):
    """A device's health in short (the agent's ``/healthz`` report, bounded)."""

    device_id: str = Field(pattern=NAME_PATTERN, description="Must be the token's device.")
    at: float = Field(ge=0, le=32503680000, description="Report time, epoch seconds UTC.")
    status: Status = Field(description="The agent's overall state (worst component).")
    agent_version: str = Field("", max_length=64, pattern=TEXT_PATTERN,
                               description="The agent's version.")
    reasons: list[Annotated[str, Field(max_length=MAX_REASON, pattern=TEXT_PATTERN)]] = Field(
        default_factory=list, max_length=16,
        description="``component: reason`` of the non-green components (at most 16).",
    )
    streams: list[StreamHealth] = Field(default_factory=list, max_length=MAX_STREAMS,
                                        description="Each stream's source state.")
    models: list[ModelHealth] = Field(default_factory=list, max_length=MAX_MODELS,
                                      description="The model each stream runs.")
    backlog_alerts: Count = Field(0, description="Alerts not yet uploaded.")
    backlog_aggregates: Count = Field(0, description="Aggregates not yet uploaded.")
    disk: DiskUse | None = Field(None, description="Store disk use, if known.")
