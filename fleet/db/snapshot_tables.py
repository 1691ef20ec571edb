"""Table of the camera alert snapshots devices upload; migration ``0004`` creates exactly this.

``alert_snapshots``: one row per alert and image ``kind`` (``snapshot``: the alerting frame as
JPEG; ``heatmap``: the anomaly overlay as PNG), beside the alert (``alert_id`` is the alert's
``id``; the row goes when the device does). ``data`` is the image as sent (already opened and
checked, :mod:`fleet.api.snapshots`); ``width``/``height`` its size in pixels.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Table,
    UniqueConstraint,
)

from fleet.db.schema import UtcDateTime, metadata

alert_snapshots = Table(
    "alert_snapshots",
    metadata,
    Column("pk", Integer().with_variant(BigInteger, "postgresql"), primary_key=True),
    Column(
        "device_id", String(64), ForeignKey("devices.device_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("alert_id", String(160), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("content_type", String(32), nullable=False),
    Column("width", Integer, nullable=False),
    Column("height", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    UniqueConstraint("alert_id", "kind", name="uq_alert_snapshots_alert_id_kind"),
)
