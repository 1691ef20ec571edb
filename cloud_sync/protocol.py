"""Wire schemas between gateway and fleet (JSON over HTTP), version 1.

Ingest: ``POST /v1/ingest`` with ``Authorization: Bearer <device token>``, body an
:class:`IngestBatch` as JSON, usually gzip-compressed (``Content-Encoding: gzip``). Every record
carries an id made on the device that is stable across retries:

* alert: ``<device_id>:<stream>:<seq>`` (``seq`` from the device's store, never reused);
* aggregate: ``<device_id>:<stream>:<interval_start in integer ms>``.

Ingest is idempotent on ``(kind, id)``: the same batch sent twice stores each record once. The
response, an :class:`IngestResult`, says per record index whether it was ``accepted`` (stored now),
``duplicate`` (already stored: also safe to clear) or ``rejected`` (with a reason; the device
moves it to its dead-letter table and never resends it). The device clears exactly the records
the response names as accepted or duplicate.

Errors: 400 malformed body, 401 missing/unknown token, 403 a device writing another device's
records, 413 body or batch too large, 415 wrong content type, 422 schema violation, 429/503 with
``Retry-After`` (seconds) when the fleet sheds load. A 5xx other than 503 is retried with backoff.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
#: Largest batch the fleet accepts (records); the agent sends at most this many.
MAX_BATCH_RECORDS = 5_000
#: Largest decompressed body the fleet accepts, bytes.
MAX_BODY_BYTES = 16 * 1024 * 1024

ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}:[A-Za-z0-9_.-]{1,64}:-?[0-9]{1,20}$"
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChannelStatsBody(_Wire):
    """One channel's stats over an interval (channel units)."""

    channel: str = Field(min_length=1, max_length=128)
    count: int = Field(ge=0)
    min: float | None
    max: float | None
    mean: float | None
    std: float | None = Field(ge=0)


class AggregateBody(_Wire):
    """An aggregate as sent on the wire (see :class:`agent.records.Aggregate`)."""

    device_id: str = Field(pattern=NAME_PATTERN)
    stream: str = Field(pattern=NAME_PATTERN)
    interval_start: float = Field(ge=0, le=32503680000, description="Epoch seconds UTC.")
    interval_s: float = Field(gt=0, le=86400)
    count: int = Field(ge=0)
    channels: list[ChannelStatsBody] = Field(max_length=1024)
    max_score: float | None
    windows: int = Field(ge=0)
    alert_count: int = Field(ge=0)


class TopChannelBody(_Wire):
    channel: str = Field(min_length=1, max_length=128)
    contribution: float = Field(ge=0, le=1)


class ModelRef(_Wire):
    name: str = Field(min_length=1, max_length=64)
    version: int = Field(ge=0)


class AlertBody(_Wire):
    """An alert: the MQTT payload, schema 1 (see :mod:`agent.publish.mqtt`)."""

    schema_: Literal[1] = Field(alias="schema")
    alert_id: str = Field(pattern=ID_PATTERN)
    device_id: str = Field(pattern=NAME_PATTERN)
    stream: str = Field(pattern=NAME_PATTERN)
    seq: int = Field(ge=0)
    model: ModelRef
    score: float
    threshold: float
    window_start: str = Field(max_length=40, description="ISO 8601 UTC with Z.")
    window_end: str = Field(max_length=40)
    raised_at: str = Field(max_length=40)
    top_channels: list[TopChannelBody] = Field(max_length=64)


class AlertRecord(_Wire):
    kind: Literal["alert"]
    id: str = Field(pattern=ID_PATTERN)
    body: AlertBody


class AggregateRecord(_Wire):
    kind: Literal["aggregate"]
    id: str = Field(pattern=ID_PATTERN)
    body: AggregateBody


Record = AlertRecord | AggregateRecord


class Backlog(_Wire):
    """What the device still holds unsent (reported so operators see lagging gateways)."""

    alerts: int = Field(ge=0)
    aggregates: int = Field(ge=0)


class IngestBatch(_Wire):
    """``POST /v1/ingest`` body."""

    schema_: Literal[1] = Field(1, alias="schema")
    device_id: str = Field(pattern=NAME_PATTERN)
    sent_at: float = Field(description="Epoch seconds UTC when the batch was sent.")
    agent_version: str = Field("", max_length=64)
    model: ModelRef | None = None
    backlog: Backlog
    records: list[Record] = Field(max_length=MAX_BATCH_RECORDS)


RecordStatus = Literal["accepted", "duplicate", "rejected"]


class RecordResult(_Wire):
    index: int = Field(ge=0)
    status: RecordStatus
    reason: str | None = None


class IngestResult(_Wire):
    """``POST /v1/ingest`` 200 response: one result per record, by index."""

    results: list[RecordResult]


class EnrollRequest(_Wire):
    """``POST /v1/devices`` (admin token): register a device."""

    device_id: str = Field(pattern=NAME_PATTERN)
    tags: list[str] = Field(default_factory=list, max_length=32)


class EnrollResponse(_Wire):
    """The device token, shown once; the fleet stores only its hash."""

    device_id: str
    token: str
