"""Request and response models of the fleet-operations routes (health, webhooks, console
queries). Times are ISO 8601 UTC."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cloud_sync.protocol import TEXT_PATTERN
from fleet.db.webhooks import Delivery, Webhook


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WebhookCreate(_Model):
    """``POST /v1/webhooks`` (admin): subscribe a URL to events."""

    url: str = Field(max_length=2048, pattern=TEXT_PATTERN,
                     description="http(s)://host[:port]/path the fleet POSTs events to.")
    events: list[Literal["alert", "device_offline", "rollout_halted"]] = Field(
        min_length=1, max_length=3, description="Events to deliver.")
    secret: str = Field(min_length=16, max_length=256, pattern=TEXT_PATTERN,
                        description="HMAC-SHA256 key of the X-Edge-Signature-256 header.")


class WebhookOut(_Model):
    id: int
    url: str
    events: list[str]
    created_at: dt.datetime

    @classmethod
    def of(cls, w: Webhook) -> WebhookOut:
        return cls(id=w.id, url=w.url, events=w.events, created_at=w.created_at)


class WebhookList(_Model):
    webhooks: list[WebhookOut]


class DeliveryOut(_Model):
    """One queued event for one webhook."""

    id: int
    webhook_id: int
    event: str
    state: Literal["pending", "delivered", "dead"]
    attempts: int
    next_attempt_at: dt.datetime
    last_status: int | None
    last_error: str | None
    created_at: dt.datetime
    finished_at: dt.datetime | None
    body: str = Field(description="The JSON body as sent (and signed).")

    @classmethod
    def of(cls, d: Delivery) -> DeliveryOut:
        return cls(id=d.id, webhook_id=d.webhook_id, event=d.event,
                   state=d.state,
                   attempts=d.attempts, next_attempt_at=d.next_attempt_at,
                   last_status=d.last_status, last_error=d.last_error,
                   created_at=d.created_at, finished_at=d.finished_at, body=d.body)


class DeliveryList(_Model):
    deliveries: list[DeliveryOut]


class SeriesPoint(_Model):
    """One bucket of a stream's aggregates."""

    t: dt.datetime = Field(description="Bucket start (UTC).")
    max_score: float | None = Field(description="Largest window score in the bucket.")
    count: int = Field(description="Readings in the bucket.")
    alerts: int = Field(description="Alerts raised in the bucket.")


class Series(_Model):
    """``GET /v1/devices/{device_id}/series``: a stream's score over time, downsampled in SQL."""

    device_id: str
    stream: str
    bucket_s: float = Field(description="Width of one bucket, seconds.")
    threshold: float | None = Field(
        description="The stream's alert threshold: of its newest alert in the range, if any.")
    points: list[SeriesPoint]


class FleetAlertOut(_Model):
    id: str
    device_id: str
    stream: str
    score: float
    threshold: float
    window_start: dt.datetime
    model_name: str
    model_version: int


class FleetAlertPage(_Model):
    """``GET /v1/alerts``: alerts across the fleet, newest first."""

    items: list[FleetAlertOut]
    truncated: bool


