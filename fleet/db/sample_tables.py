"""Table of the retraining samples devices upload (``POST /v1/samples``); migration ``0003``
creates exactly this.

``samples``: one row per accepted :class:`cloud_sync.protocol.SampleBatch`. ``kind`` is
``calibration`` (``windows`` holds one block: the stream's first N raw readings, shape
``(1, N, C)``) or ``reservoir`` (raw windows the device classified normal, ``(K, W, C)``).
``windows`` is the JSON array as sent (channel units); ``shape`` is ``[K, W, C]``.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, ForeignKey, Index, Integer, String, Table

from fleet.db.schema import JsonDoc, UtcDateTime, metadata

samples = Table(
    "samples",
    metadata,
    Column("pk", Integer().with_variant(BigInteger, "postgresql"), primary_key=True),
    Column(
        "device_id", String(64), ForeignKey("devices.device_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("stream", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("channels", JsonDoc, nullable=False),
    Column("model_name", String(64), nullable=True),
    Column("model_version", BigInteger, nullable=True),
    Column("config_hash", String(128), nullable=False),
    Column("sample_rate_hz", Float, nullable=True),
    Column("shape", JsonDoc, nullable=False),
    Column("windows", JsonDoc, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    Index(None, "device_id", "stream", "kind", "received_at"),
)
