"""Device health in the fleet: the latest summary per device, online/offline, counts by state.

A device is ``online`` while it reported health or uploaded within ``offline_after_s``
(``edge-fleet serve --offline-after``, default 300 s); :meth:`HealthStore.sweep` marks the
others ``offline`` with one conditional ``UPDATE`` per device that went silent, so with any number
of worker processes each device goes offline once and exactly one sweep sees it (its
``device_offline`` webhook event is queued once). A report or an upload brings it back online.

Silence counts from the later of ``device_health.received_at`` and ``devices.last_seen``: an
agent older than health reports (no row here) is shown ``unknown`` until it is silent past the
limit after its last upload, then ``offline``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from sqlalchemy import (
    Connection,
    Engine,
    Text,
    case,
    insert,
    literal,
    or_,
    select,
    text,
    type_coerce,
    update,
)

from cloud_sync.health import HealthSummary
from fleet.db.ops_tables import device_health
from fleet.db.schema import UtcDateTime, devices

State = Literal["online", "offline", "unknown"]
#: Default silence after which a device is offline (seconds).
DEFAULT_OFFLINE_AFTER_S = 300.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True)
class DeviceHealth:
    """What the fleet knows of one device's health.

    Attributes:
        state: online, offline, or unknown (never reported health and not yet silent).
        status: The agent's green/yellow/red, or None (never reported).
        summary: The latest :class:`~cloud_sync.health.HealthSummary` as a dict, or None.
        received_at: When the latest summary arrived, or None.
    """

    state: State
    status: str | None
    summary: dict[str, Any] | None
    received_at: dt.datetime | None


def state_of(last_contact: dt.datetime | None, reported: bool, now: dt.datetime,
             offline_after_s: float) -> State:
    """A device's state from its last contact (pure).

    >>> t = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    >>> state_of(t, True, t + dt.timedelta(seconds=10), 300)
    'online'
    >>> state_of(t, False, t + dt.timedelta(seconds=301), 300)
    'offline'
    >>> state_of(None, False, t, 300)
    'unknown'
    """
    if last_contact is None:
        return "unknown"
    if (now - last_contact).total_seconds() > offline_after_s:
        return "offline"
    return "online" if reported else "unknown"


#: ``GET /v1/devices`` on PostgreSQL (see :meth:`HealthStore.listing_json`).
_PG_LISTING = text("""
SELECT coalesce(json_agg(json_build_object(
    'device_id', d.device_id, 'tags', d.tags, 'created_at', d.created_at,
    'revoked_at', d.revoked_at, 'last_seen', d.last_seen, 'agent_version', d.agent_version,
    'model_name', d.model_name, 'model_version', d.model_version,
    'backlog', json_build_object('alerts', d.backlog_alerts,
                                 'aggregates', d.backlog_aggregates),
    'state', CASE WHEN greatest(d.last_seen, h.received_at) IS NULL THEN 'unknown'
                  WHEN greatest(d.last_seen, h.received_at) < :cutoff THEN 'offline'
                  WHEN h.received_at IS NULL THEN 'unknown' ELSE 'online' END,
    'health', h.summary, 'health_received_at', h.received_at
) ORDER BY d.device_id), '[]'::json)::text
FROM devices d LEFT JOIN device_health h ON h.device_id = d.device_id
WHERE (:all OR d.revoked_at IS NULL) AND (CAST(:device AS text) IS NULL OR d.device_id = :device)
""")


#: :meth:`HealthStore.put` on PostgreSQL; ``%s`` parameters in order: now, agent_version,
#: backlog_alerts, backlog_aggregates, device_id (twice), status, summary (JSON text), now. The
#: time it came online (``state_since``) stays unless the device was offline until now. The
#: statement turns ``synchronous_commit`` off for its own transaction only (``set_config(...,
#: true)``; see :meth:`HealthStore.put`).
_PG_PUT = (
    "WITH dev AS (UPDATE devices SET last_seen = %s, agent_version = %s, backlog_alerts = %s, "
    "backlog_aggregates = %s WHERE device_id = %s) "
    "INSERT INTO device_health AS h (device_id, status, state, summary, received_at, "
    "state_since) SELECT %s, %s, 'online', CAST(%s AS jsonb), t, t FROM "
    "(SELECT CAST(%s AS timestamptz) AS t, "
    "set_config('synchronous_commit', 'off', true) AS async_commit) AS now "
    "ON CONFLICT (device_id) DO UPDATE SET status = excluded.status, "
    "summary = excluded.summary, received_at = excluded.received_at, state = 'online', "
    "state_since = CASE WHEN h.state = 'online' THEN h.state_since "
    "ELSE excluded.state_since END"
)


class HealthStore:
    """The ``device_health`` table.

    Args:
        engine: The fleet database.
        offline_after_s: Silence after which a device is offline, seconds (> 0).
        clock: Aware UTC now.
    """

    def __init__(self, engine: Engine, offline_after_s: float = DEFAULT_OFFLINE_AFTER_S,
                 clock: Callable[[], dt.datetime] = _now) -> None:
        if not offline_after_s > 0:
            raise ValueError("offline_after_s must be positive")
        self._engine = engine
        self.offline_after_s = offline_after_s
        self._clock = clock

    def put(self, device_id: str, summary: HealthSummary) -> None:
        """Store ``summary`` as the device's latest (online from now); also updates the
        device's ``last_seen``, agent version and backlog.

        PostgreSQL: one autocommit statement (:data:`_PG_PUT`: the ``devices`` update in a
        data-modifying CTE and an ``INSERT ... ON CONFLICT DO UPDATE``), atomic as a whole and
        one round trip, committed asynchronously (``synchronous_commit`` off for this
        transaction only): the answer does not wait for the WAL flush (an fsync of the
        database's disk), so a slow disk does not hold a pooled connection per report. A
        report answered in the last moment (``wal_writer_delay``, 200 ms by default, up to
        three times that) before PostgreSQL crashes can be lost; the device sends its next
        one a health interval later. Ingest batches stay synchronous (a device clears what
        was acknowledged). SQLite: update, else insert, in one transaction (one writer at a
        time).

        Raises:
            sqlalchemy.exc.OperationalError: The database failed.
        """
        now = self._clock()
        if self._engine.dialect.name == "postgresql":
            params = (now, summary.agent_version or None, summary.backlog_alerts,
                      summary.backlog_aggregates, device_id, device_id, summary.status,
                      summary.model_dump_json(), now)
            with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                c.exec_driver_sql(_PG_PUT, params)
            return
        doc = summary.model_dump(mode="json")
        with self._engine.begin() as conn:
            conn.execute(update(devices).where(devices.c.device_id == device_id).values(
                last_seen=now, agent_version=summary.agent_version or None,
                backlog_alerts=summary.backlog_alerts,
                backlog_aggregates=summary.backlog_aggregates,
            ))
            changed = conn.execute(
                update(device_health).where(device_health.c.device_id == device_id).values(
                    status=summary.status, summary=doc, received_at=now,
                    state="online",
                    # the time it came online stays, unless it was offline until now
                    state_since=case((device_health.c.state == "online",
                                      device_health.c.state_since),
                                     else_=literal(now, UtcDateTime())),
                )
            ).rowcount
            if not changed:
                conn.execute(insert(device_health).values(
                    device_id=device_id, status=summary.status, state="online", summary=doc,
                    received_at=now, state_since=now,
                ))

    def sweep(
        self, on_offline: Callable[[Connection, str, dt.datetime], object] | None = None
    ) -> list[str]:
        """Mark every device silent past ``offline_after_s`` offline.

        Args:
            on_offline: Called with ``(connection, device_id, last contact)`` for each device
                that went offline, inside the sweep's transaction (queue its webhook event).

        Returns:
            The ids that went offline in THIS call (each id is returned by one call only, in
            any number of processes).
        """
        now = self._clock()
        cutoff = now - dt.timedelta(seconds=self.offline_after_s)
        with self._engine.begin() as conn:
            silent = conn.execute(
                select(device_health.c.device_id, device_health.c.received_at)
                .join(devices, devices.c.device_id == device_health.c.device_id)
                .where(device_health.c.state == "online", device_health.c.received_at < cutoff,
                       or_(devices.c.last_seen.is_(None), devices.c.last_seen < cutoff),
                       devices.c.revoked_at.is_(None))
            ).all()
            gone = []
            for device_id, last in silent:
                if conn.execute(
                    update(device_health)
                    .where(device_health.c.device_id == device_id,
                           device_health.c.state == "online")
                    .values(state="offline", state_since=now)
                ).rowcount:
                    gone.append(str(device_id))
                    if on_offline is not None:
                        on_offline(conn, str(device_id), last)
            self._back_online(conn, cutoff, now)
        return gone

    @staticmethod
    def _back_online(conn: Connection, cutoff: dt.datetime, now: dt.datetime) -> None:
        """Devices marked offline that uploaded since (an upload is contact too)."""
        back = select(devices.c.device_id).where(
            devices.c.device_id == device_health.c.device_id, devices.c.last_seen >= cutoff)
        conn.execute(update(device_health)
                     .where(device_health.c.state == "offline", back.exists())
                     .values(state="online", state_since=now))

    def all(self) -> dict[str, DeviceHealth]:
        """Every active device's health, by id (one query joining ``devices``)."""
        now = self._clock()
        query = (
            select(devices.c.device_id, devices.c.last_seen, device_health.c.status,
                   device_health.c.summary, device_health.c.received_at)
            .select_from(devices.outerjoin(
                device_health, device_health.c.device_id == devices.c.device_id))
            .where(devices.c.revoked_at.is_(None))
        )
        with self._engine.connect() as conn:
            rows = conn.execute(query).all()
        return {str(r.device_id): self._health(r, now) for r in rows}

    def listing_json(self, *, include_revoked: bool = False, device_id: str | None = None
                     ) -> bytes:
        """``GET /v1/devices``'s answer (:class:`fleet.api.models.DeviceList` as JSON bytes):
        every device by id (or only ``device_id``: a list of one or none) with its state and
        latest health, in ONE query.

        PostgreSQL builds the whole answer (``json_agg``; the state as :func:`state_of`
        computes it, times with their UTC offset); on SQLite the JSON columns leave the
        database as text and go into the answer as they are (``msgspec.Raw``). Either way 1,000
        devices are not parsed into dicts only to be encoded again
        (``benchmarks/console_scale.py``: 9 ms instead of 20 ms on PostgreSQL).
        """
        now = self._clock()
        if self._engine.dialect.name == "postgresql":
            cutoff = now - dt.timedelta(seconds=self.offline_after_s)
            with self._engine.connect() as conn:
                found = conn.execute(_PG_LISTING, {"cutoff": cutoff, "all": include_revoked,
                                                   "device": device_id}).scalar_one()
            return b'{"devices":' + str(found).encode() + b"}"
        query = (
            select(devices.c.device_id, type_coerce(devices.c.tags, Text).label("tags"),
                   devices.c.created_at, devices.c.revoked_at, devices.c.last_seen,
                   devices.c.agent_version, devices.c.model_name, devices.c.model_version,
                   devices.c.backlog_alerts, devices.c.backlog_aggregates,
                   type_coerce(device_health.c.summary, Text).label("summary"),
                   device_health.c.received_at)
            .select_from(devices.outerjoin(
                device_health, device_health.c.device_id == devices.c.device_id))
            .order_by(devices.c.device_id)
        )
        if not include_revoked:
            query = query.where(devices.c.revoked_at.is_(None))
        if device_id is not None:
            query = query.where(devices.c.device_id == device_id)
        with self._engine.connect() as conn:
            rows = conn.execute(query).all()
        out = []
        for r in rows:
            out.append({
                "device_id": r.device_id, "tags": msgspec.Raw(r.tags.encode()),
                "created_at": r.created_at, "revoked_at": r.revoked_at,
                "last_seen": r.last_seen, "agent_version": r.agent_version,
                "model_name": r.model_name, "model_version": r.model_version,
                "backlog": {"alerts": r.backlog_alerts, "aggregates": r.backlog_aggregates},
                "state": self._health(r, now).state,
                "health": None if r.summary is None else msgspec.Raw(r.summary.encode()),
                "health_received_at": r.received_at,
            })
        return msgspec.json.encode({"devices": out})

    def _health(self, row: Any, now: dt.datetime) -> DeviceHealth:
        summary = getattr(row, "summary", None)
        contacts = [t for t in (row.last_seen, row.received_at) if t is not None]
        last = max(contacts) if contacts else None
        return DeviceHealth(
            state=state_of(last, row.received_at is not None, now, self.offline_after_s),
            status=getattr(row, "status", None),
            summary=summary if isinstance(summary, dict) else None,
            received_at=row.received_at,
        )

    def counts(self) -> dict[str, int]:
        """Active devices by state (the ``fleet_devices`` gauge)."""
        out: dict[str, int] = {"online": 0, "offline": 0, "unknown": 0}
        for h in self.all().values():
            out[h.state] += 1
        return out

