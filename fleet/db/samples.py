"""Sample store: the raw windows devices upload for retraining (``samples`` table).

One accepted :class:`~cloud_sync.protocol.SampleBatch` is one row. Retention is bounded per
device, stream and kind: after each insert only the newest ``keep_batches`` rows stay (a device
that uploads its reservoir every hour does not grow the table without end).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sqlalchemy import Engine, delete, insert, select

from cloud_sync.protocol import SampleBatch
from fleet.db.sample_tables import samples

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class StoredSamples:
    """One stored batch.

    Attributes:
        device_id: Whose.
        stream: Which stream.
        kind: ``calibration`` or ``reservoir``.
        channels: Channel names, the last axis of ``windows``.
        sample_rate_hz: As the device reported it (None if unknown).
        model_name: Model the device ran when it sent them.
        model_version: Its version.
        config_hash: The device's stream config hash.
        windows: Shape ``(K, W, C)`` float64, channel units (calibration: ``(1, N, C)``).
        received_at: When the fleet stored it (aware UTC).
    """

    device_id: str
    stream: str
    kind: str
    channels: tuple[str, ...]
    sample_rate_hz: float | None
    model_name: str | None
    model_version: int | None
    config_hash: str
    windows: FloatArray
    received_at: dt.datetime


class SampleStore:
    """Samples in the database.

    Args:
        engine: SQLAlchemy engine (SQLite or PostgreSQL).
        keep_batches: Newest batches kept per (device, stream, kind).
    """

    def __init__(self, engine: Engine, keep_batches: int = 50) -> None:
        if keep_batches < 1:
            raise ValueError("keep_batches must be at least 1")
        self._engine = engine
        self.keep_batches = keep_batches

    def add(self, batch: SampleBatch, now: dt.datetime) -> int:
        """Store ``batch`` (already validated, device already authorised) and apply retention.

        Returns:
            Windows stored.
        """
        arr = np.asarray(batch.windows, dtype=np.float64)
        row = {
            "device_id": batch.device_id, "stream": batch.stream, "kind": batch.kind,
            "channels": list(batch.channels),
            "model_name": batch.model.name if batch.model else None,
            "model_version": batch.model.version if batch.model else None,
            "config_hash": batch.config_hash, "sample_rate_hz": batch.sample_rate_hz,
            "shape": list(arr.shape), "windows": batch.windows, "received_at": now,
        }
        key = (
            (samples.c.device_id == batch.device_id)
            & (samples.c.stream == batch.stream)
            & (samples.c.kind == batch.kind)
        )
        with self._engine.begin() as conn:
            conn.execute(insert(samples).values(**row))
            keep = (
                select(samples.c.pk).where(key).order_by(samples.c.pk.desc())
                .limit(self.keep_batches).scalar_subquery()
            )
            conn.execute(delete(samples).where(key & samples.c.pk.not_in(keep)))
        return int(arr.shape[0])

    def _rows(self, device_id: str, stream: str, kind: str, limit: int) -> list[StoredSamples]:
        q = (
            select(samples)
            .where(
                (samples.c.device_id == device_id)
                & (samples.c.stream == stream)
                & (samples.c.kind == kind)
            )
            .order_by(samples.c.pk.desc())
            .limit(limit)
        )
        with self._engine.connect() as conn:
            rows = conn.execute(q).all()
        return [
            StoredSamples(
                device_id=r.device_id, stream=r.stream, kind=r.kind,
                channels=tuple(r.channels), sample_rate_hz=r.sample_rate_hz,
                model_name=r.model_name,
                model_version=None if r.model_version is None else int(r.model_version),
                config_hash=r.config_hash,
                windows=np.asarray(r.windows, dtype=np.float64).reshape(tuple(r.shape)),
                received_at=r.received_at,
            )
            for r in rows
        ]

    def latest_calibration(self, device_id: str, stream: str) -> StoredSamples | None:
        """The newest ``calibration`` batch of ``device_id``/``stream``, or None."""
        rows = self._rows(device_id, stream, "calibration", 1)
        return rows[0] if rows else None

    def reservoir(
        self, device_id: str, stream: str, channels: tuple[str, ...], max_windows: int = 10_000
    ) -> FloatArray | None:
        """The newest reservoir windows with exactly ``channels`` and one window length.

        Returns:
            Shape ``(K, W, C)`` (newest batches first, at most ``max_windows``), or None.
        """
        parts: list[FloatArray] = []
        total = 0
        for r in self._rows(device_id, stream, "reservoir", self.keep_batches):
            if r.channels != channels or (parts and r.windows.shape[1:] != parts[0].shape[1:]):
                continue
            parts.append(r.windows)
            total += r.windows.shape[0]
            if total >= max_windows:
                break
        return np.concatenate(parts)[:max_windows] if parts else None
