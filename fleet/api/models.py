"""Response models of the operator-facing endpoints (the device-facing ones live in
:mod:`cloud_sync.protocol`). Times are ISO 8601 UTC."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cloud_sync.protocol import TEXT_PATTERN
from fleet.db.devices import Device
from fleet.db.health import DeviceHealth


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BacklogOut(_Out):
    alerts: int | None
    aggregates: int | None


class DeviceOut(_Out):
    """A device as listed by ``GET /v1/devices``."""

    device_id: str
    tags: list[str]
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    last_seen: dt.datetime | None
    agent_version: str | None
    model_name: str | None
    model_version: int | None
    backlog: BacklogOut
    state: Literal["online", "offline", "unknown"] | None = Field(
        None, description="online / offline (silent past --offline-after) / unknown (never "
        "reported health); set by GET /v1/devices.")
    health: dict[str, Any] | None = Field(
        None, description="The latest health summary (cloud_sync.health.HealthSummary), or "
        "null.")
    health_received_at: dt.datetime | None = Field(
        None, description="When the fleet received that summary.")

    @classmethod
    def of(cls, device: Device, health: DeviceHealth | None = None) -> DeviceOut:
        return cls(
            state=None if health is None else health.state,
            health=None if health is None else health.summary,
            health_received_at=None if health is None else health.received_at,
            device_id=device.device_id,
            tags=list(device.tags),
            created_at=device.created_at,
            revoked_at=device.revoked_at,
            last_seen=device.last_seen,
            agent_version=device.agent_version,
            model_name=device.model_name,
            model_version=device.model_version,
            backlog=BacklogOut(
                alerts=device.backlog_alerts, aggregates=device.backlog_aggregates
            ),
        )


#: One device tag, bounded like the enrollment's (:class:`cloud_sync.protocol.EnrollRequest`).
Tag = Annotated[str, Field(min_length=1, max_length=64, pattern=TEXT_PATTERN)]


class TagsChange(BaseModel):
    """``PATCH /v1/devices/{device_id}/tags``: tags to add and to remove."""

    model_config = ConfigDict(extra="forbid")

    add: list[Tag] = Field(default_factory=list, max_length=32, description="Tags to add.")
    remove: list[Tag] = Field(default_factory=list, max_length=32,
                              description="Tags to remove.")


class DeviceList(_Out):
    devices: list[DeviceOut]


class AggregateOut(_Out):
    id: str
    device_id: str
    stream: str
    interval_start: dt.datetime
    interval_s: float
    count: int
    channels: list[dict[str, Any]]
    max_score: float | None
    windows: int
    alert_count: int
    received_at: dt.datetime


class AlertOut(_Out):
    id: str
    device_id: str
    stream: str
    seq: int
    score: float
    threshold: float
    window_start: dt.datetime
    window_end: dt.datetime
    raised_at: dt.datetime
    model_name: str
    model_version: int
    payload: dict[str, Any]
    received_at: dt.datetime
    #: The images stored for this alert (``snapshot``, ``heatmap``): each served at
    #: ``GET /v1/devices/{id}/alerts/{alert_id}/<kind>``.
    snapshots: list[str] = []
    event: Literal["raised", "updated", "cleared"] = Field(
        "raised", description="The episode event this record is (payload schema 2; a schema-1 "
        "alert is 'raised').")
    episode_id: str = Field("", description="The id of the episode's 'raised' record.")


class AggregatePage(_Out):
    """``GET /v1/devices/{id}/aggregates``: oldest first; ``truncated`` when ``limit`` cut it."""

    items: list[AggregateOut]
    truncated: bool = Field(description="More rows match; ask again with since = last time.")


class AlertPage(_Out):
    """``GET /v1/devices/{id}/alerts``: oldest first."""

    items: list[AlertOut]
    truncated: bool
