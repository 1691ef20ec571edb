"""Tables of fleet operations: device health, webhooks and their delivery queue. Migration
``0005`` creates exactly these (and indexes on ``alerts`` and ``aggregates`` for the
console's queries and retention, see that revision).

* ``device_health``: the LATEST health summary of each device
  (:class:`cloud_sync.health.HealthSummary`), one row per device, replaced on every report.
  ``state`` is ``online`` or ``offline`` (set by :class:`fleet.db.health.HealthStore.sweep`);
  ``status`` is the agent's own green/yellow/red.
* ``webhooks``: an operator's subscription: URL, events (JSON list), HMAC secret (kept so the
  fleet can sign; who can read the database can forge deliveries, as with GitHub's secrets).
* ``webhook_deliveries``: the durable queue. ``state`` pending -> delivered, or -> dead after the
  retry cap; ``next_attempt_at`` orders the work; ``lease_until`` keeps one worker process on
  one delivery at a time.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
)

from fleet.db.schema import JsonDoc, UtcDateTime, metadata

_PK = Integer().with_variant(BigInteger, "postgresql")

device_health = Table(
    "device_health",
    metadata,
    Column(
        "device_id", String(64), ForeignKey("devices.device_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("status", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    Column("summary", JsonDoc, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    Column("state_since", UtcDateTime, nullable=False),
)

webhooks = Table(
    "webhooks",
    metadata,
    Column("id", _PK, primary_key=True),
    Column("url", String(2048), nullable=False),
    Column("events", JsonDoc, nullable=False),
    Column("secret", String(256), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
)

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", _PK, primary_key=True),
    Column("webhook_id", _PK, ForeignKey("webhooks.id", ondelete="CASCADE"), nullable=False),
    Column("event", String(32), nullable=False),
    Column("body", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", UtcDateTime, nullable=False),
    Column("lease_until", UtcDateTime, nullable=True),
    Column("last_status", Integer, nullable=True),
    Column("last_error", String(512), nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime, nullable=True),
    Index(None, "state", "next_attempt_at"),
    Index(None, "created_at"),
)
