"""Tables (SQLAlchemy Core). The migrations in :mod:`fleet.db.migrations` create exactly these.

Times are :class:`UtcDateTime`: ``timestamptz`` on PostgreSQL, naive UTC text on SQLite (which
sorts and compares correctly because every value is UTC in one format); Python sees aware UTC.
A record's ``id`` (``<device>:<stream>:<seq or interval ms>``, see :mod:`cloud_sync.protocol`) is
UNIQUE: ingest inserts with ``ON CONFLICT DO NOTHING`` so retries store each record once.

On PostgreSQL, migration ``0009`` partitions ``alerts`` and ``aggregates`` by time
(:mod:`fleet.db.partitions`): their keys there include the time column (``(pk, time)``,
``(id, time)``) and alert ids are unique in the extra table ``alert_ids``. These Core tables
describe the SQLite schema and are the columns every query uses on both.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

#: JSON on SQLite, JSONB on PostgreSQL.
JsonDoc = JSON().with_variant(JSONB(), "postgresql")

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on every dialect."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: UTC-aware values only")
        value = value.astimezone(dt.timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        assert isinstance(value, dt.datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


devices = Table(
    "devices",
    metadata,
    Column("device_id", String(64), primary_key=True),
    # sha256 hex of the device token; NULL once revoked. Tokens are 32 random bytes, so a fast
    # hash is right (no dictionary to guess from; see OWASP "Password Storage": slow hashes are
    # for low-entropy secrets). Unique so authentication is one indexed lookup.
    Column("token_hash", String(64), unique=True, nullable=True),
    Column("tags", JsonDoc, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("revoked_at", UtcDateTime, nullable=True),
    Column("last_seen", UtcDateTime, nullable=True),
    Column("agent_version", String(64), nullable=True),
    Column("model_name", String(64), nullable=True),
    Column("model_version", BigInteger, nullable=True),
    Column("backlog_alerts", BigInteger, nullable=True),
    Column("backlog_aggregates", BigInteger, nullable=True),
)

alerts = Table(
    "alerts",
    metadata,
    Column("pk", Integer().with_variant(BigInteger, "postgresql"), primary_key=True),
    Column("id", String(160), nullable=False, unique=True),
    Column(
        "device_id", String(64), ForeignKey("devices.device_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("stream", String(64), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("score", Float, nullable=False),
    Column("threshold", Float, nullable=False),
    Column("window_start", UtcDateTime, nullable=False),
    Column("window_end", UtcDateTime, nullable=False),
    Column("raised_at", UtcDateTime, nullable=False),
    Column("model_name", String(64), nullable=False),
    Column("model_version", BigInteger, nullable=False),
    Column("payload", JsonDoc, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    Index(None, "device_id", "stream", "window_start"),
)

aggregates = Table(
    "aggregates",
    metadata,
    Column("pk", Integer().with_variant(BigInteger, "postgresql"), primary_key=True),
    Column("id", String(160), nullable=False, unique=True),
    Column(
        "device_id", String(64), ForeignKey("devices.device_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("stream", String(64), nullable=False),
    Column("interval_start", UtcDateTime, nullable=False),
    Column("interval_s", Float, nullable=False),
    Column("count", BigInteger, nullable=False),
    Column("channels", JsonDoc, nullable=False),
    Column("max_score", Float, nullable=True),
    Column("windows", BigInteger, nullable=False),
    Column("alert_count", BigInteger, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    Index(None, "device_id", "stream", "interval_start"),
)

#: Tables in dependency order (parents first).
ALL_TABLES: tuple[Table, ...] = (devices, alerts, aggregates)
