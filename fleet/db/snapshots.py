"""Snapshot store: the images of camera alerts (``alert_snapshots`` table).

One row per ``(alert_id, kind)``; storing the same again replaces it (a device resending after a
lost answer, or a fixed image), in one transaction. A snapshot is stored only beside its alert
(the device uploads it after ingest acknowledged the alert), and goes with the device.

Retention is bounded per device: after each insert only the newest ``keep_per_device`` images of
that device stay (:data:`KEEP_PER_DEVICE`, about 100 MB per device at 50 kB an image), so a
camera alerting all day does not grow the table without end; the alerts themselves stay.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Engine, delete, insert, select

from fleet.db.schema import alerts
from fleet.db.snapshot_tables import alert_snapshots

#: Images kept per device (the newest; snapshots and heatmaps each count).
KEEP_PER_DEVICE = 2000


@dataclass(frozen=True)
class StoredImage:
    """One stored image: its ``content_type``, size in pixels and bytes."""

    content_type: str
    width: int
    height: int
    data: bytes


class SnapshotStore:
    """Alert snapshots in the database (SQLite or PostgreSQL).

    Args:
        engine: SQLAlchemy engine.
        keep_per_device: Newest images kept per device.
    """

    def __init__(self, engine: Engine, keep_per_device: int = KEEP_PER_DEVICE) -> None:
        if keep_per_device < 1:
            raise ValueError("keep_per_device must be at least 1")
        self._engine = engine
        self.keep_per_device = keep_per_device

    def alert_exists(self, device_id: str, alert_id: str) -> bool:
        """True when ``device_id`` has an alert ``alert_id`` stored."""
        with self._engine.connect() as conn:
            row = conn.execute(
                select(alerts.c.pk).where((alerts.c.id == alert_id)
                                          & (alerts.c.device_id == device_id))
            ).first()
        return row is not None

    def put(self, device_id: str, alert_id: str, kind: str, image: StoredImage,
            now: dt.datetime) -> None:
        """Store (or replace) one image of an alert (already checked)."""
        key = (alert_snapshots.c.alert_id == alert_id) & (alert_snapshots.c.kind == kind)
        with self._engine.begin() as conn:
            conn.execute(delete(alert_snapshots).where(key))
            conn.execute(insert(alert_snapshots).values(
                device_id=device_id, alert_id=alert_id, kind=kind,
                content_type=image.content_type, width=image.width, height=image.height,
                data=image.data, received_at=now))
            oldest_kept = conn.execute(
                select(alert_snapshots.c.pk).where(alert_snapshots.c.device_id == device_id)
                .order_by(alert_snapshots.c.pk.desc()).offset(self.keep_per_device - 1).limit(1)
            ).scalar()
            if oldest_kept is not None:
                conn.execute(delete(alert_snapshots).where(
                    (alert_snapshots.c.device_id == device_id)
                    & (alert_snapshots.c.pk < oldest_kept)))

    def kinds(self, device_id: str, alert_ids: list[str]) -> dict[str, list[str]]:
        """``alert_id -> [kind, ...]`` (sorted) of the images stored for those alerts."""
        out: dict[str, list[str]] = {}
        if not alert_ids:
            return out
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(alert_snapshots.c.alert_id, alert_snapshots.c.kind)
                .where((alert_snapshots.c.device_id == device_id)
                       & alert_snapshots.c.alert_id.in_(alert_ids))
                .order_by(alert_snapshots.c.alert_id, alert_snapshots.c.kind)
            ).all()
        for alert_id, kind in rows:
            out.setdefault(str(alert_id), []).append(str(kind))
        return out

    def get(self, device_id: str, alert_id: str, kind: str) -> StoredImage | None:
        """The image, or None when there is none."""
        with self._engine.connect() as conn:
            row = conn.execute(
                select(alert_snapshots.c.content_type, alert_snapshots.c.width,
                       alert_snapshots.c.height, alert_snapshots.c.data)
                .where((alert_snapshots.c.alert_id == alert_id)
                       & (alert_snapshots.c.kind == kind)
                       & (alert_snapshots.c.device_id == device_id))
            ).first()
        if row is None:
            return None
        return StoredImage(str(row[0]), int(row[1]), int(row[2]), bytes(row[3]))
