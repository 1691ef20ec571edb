"""Tables of the model registry and rollouts (SQLAlchemy Core, same metadata as
:mod:`fleet.db.schema`); migration ``0002`` creates exactly these.

* ``models``: one row per uploaded package (unique ``(name, version)``); ``archive`` holds the
  canonical tar.gz bytes (packages are small; keeping them in the database means every worker and
  host sees the same bytes with no shared file system), ``manifest`` the signed manifest.
* ``rollouts``: one model version sent to a target (tag or device list, snapshot at creation),
  optionally for one stream; ``state`` in canary | paused | promoted | halted | aborted.
* ``rollout_devices``: per device of the target: canary or not, currently ``assigned``, the
  version it ran before (fallback on abort), its last reported state and reason.
* ``model_status_reports``: every :class:`cloud_sync.protocol.ModelStatusReport` received.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from fleet.db.schema import JsonDoc, UtcDateTime, metadata

_PK = Integer().with_variant(BigInteger, "postgresql")

models = Table(
    "models",
    metadata,
    Column("pk", _PK, primary_key=True),
    Column("name", String(64), nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("archive", LargeBinary, nullable=False),
    Column("archive_sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("manifest", JsonDoc, nullable=False),
    Column("key_id", String(64), nullable=False),
    Column("uploaded_at", UtcDateTime, nullable=False),
    Column("uploaded_by", String(64), nullable=False),
    # set when the stored archive no longer matches archive_sha256 (fleet.registry.integrity)
    Column("corrupt_at", UtcDateTime, nullable=True),
    Column("corrupt_reason", Text, nullable=True),
    UniqueConstraint("name", "version"),
)

rollouts = Table(
    "rollouts",
    metadata,
    Column("id", _PK, primary_key=True),
    Column("model_name", String(64), nullable=False),
    Column("model_version", BigInteger, nullable=False),
    Column("target_tag", String(64), nullable=True),
    Column("target_devices", JsonDoc, nullable=False),
    Column("stream", String(64), nullable=True),
    Column("canary_percent", Float, nullable=True),
    Column("halt_after_failures", Integer, nullable=False),
    Column("state", String(16), nullable=False, index=True),
    Column("resume_state", String(16), nullable=True),
    Column("reason", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    ForeignKeyConstraint(["model_name", "model_version"], ["models.name", "models.version"]),
)

rollout_devices = Table(
    "rollout_devices",
    metadata,
    Column(
        "rollout_id", _PK, ForeignKey("rollouts.id", ondelete="CASCADE"), primary_key=True
    ),
    Column(
        "device_id", String(64), ForeignKey("devices.device_id", ondelete="CASCADE"),
        primary_key=True, index=True,
    ),
    Column("canary", Boolean, nullable=False),
    Column("assigned", Boolean, nullable=False),
    Column("previous_version", BigInteger, nullable=True),
    Column("state", String(16), nullable=True),
    Column("reason", Text, nullable=True),
    Column("reported_at", UtcDateTime, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
)

model_status_reports = Table(
    "model_status_reports",
    metadata,
    Column("pk", _PK, primary_key=True),
    Column(
        "device_id", String(64), ForeignKey("devices.device_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("rollout_id", BigInteger, nullable=True),
    Column("stream", String(64), nullable=True),
    Column("name", String(64), nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("details", JsonDoc, nullable=False),
    Column("at", Float, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    Index(None, "device_id", "received_at"),
)
