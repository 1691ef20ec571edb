"""The retraining job queue's table (SQLAlchemy Core, same metadata as :mod:`fleet.db.schema`);
migration ``0008`` creates exactly this. The queue itself: :mod:`fleet.jobs.queue`.

* ``retrain_jobs``: one retraining of one device stream. ``state`` queued -> running -> done
  (published), gated (refused by its gate), or failed (``reason`` says why); a running job whose
  worker stopped (released) or lost the job (lease expired) is queued or claimable again.
  ``lease_owner``/``lease_until``: the worker holding a running job and until when (renewed by
  its heartbeats). ``attempts`` counts claims, at most ``max_attempts``. ``run_after``: not
  claimed before (retry back-off). ``time_limit_s``: a worker gives the job up after this long.
  ``result_*``: the published (or gated) package and the rollout. A partial unique index on
  ``(device_id, stream)`` over the queued and running rows keeps at most one pending job per
  device stream (a second request is coalesced into it).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    text,
)

from fleet.db.schema import UtcDateTime, metadata

_PK = Integer().with_variant(BigInteger, "postgresql")
#: Where the partial unique index applies (the same text on both dialects).
PENDING_WHERE = "state IN ('queued', 'running')"

retrain_jobs = Table(
    "retrain_jobs",
    metadata,
    Column("id", _PK, primary_key=True),
    Column(
        "device_id", String(64), ForeignKey("devices.device_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("stream", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("requested_by", String(64), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("time_limit_s", Float, nullable=False),
    Column("run_after", UtcDateTime, nullable=False),
    Column("lease_owner", String(128), nullable=True),
    Column("lease_until", UtcDateTime, nullable=True),
    Column("progress", String(200), nullable=True),
    Column("progress_fraction", Float, nullable=True),
    Column("result_name", String(64), nullable=True),
    Column("result_version", BigInteger, nullable=True),
    Column("rollout_id", BigInteger, nullable=True),
    Column("reason", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("started_at", UtcDateTime, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime, nullable=True),
    Index(None, "state", "run_after"),
    Index("uq_retrain_jobs_pending", "device_id", "stream", unique=True,
          postgresql_where=text(PENDING_WHERE), sqlite_where=text(PENDING_WHERE)),
)
