"""Rollouts: send one registry version to a target, canary first, and follow device reports
(the operator side; what devices are assigned and report: :mod:`fleet.registry.device_rollouts`,
which :class:`RolloutService` delegates to).

* Target: a tag (every active device carrying it) or a device list, resolved once at creation
  (devices enrolled later are not added). Canary devices: :func:`fleet.registry.policy.
  pick_canaries`. Without ``canary_percent`` the rollout starts ``promoted``.
* Concurrent operators (on any replica): :meth:`RolloutService.act` locks the rollout's row
  (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite has one writer at a time) and updates it only
  in the state it read, so two actions run one after the other and each sees the other's result.
  An action whose ``expected_state`` (the state the operator saw) is no longer the rollout's is
  refused with a Conflict (409): of a promote and an abort sent together from the same view,
  exactly one applies.
* Superseded (``superseded_by``): every device of the rollout follows a newer rollout of the
  same stream or of every stream (the assignment rule of
  :mod:`fleet.registry.device_rollouts`), so the rollout decides nothing
  any more; every action on it is refused (409) and its ``actions`` are empty
  (:func:`superseded`).
* Resuming a halted rollout (and any action but abort) clears its ``reason``: the reason says
  why it is halted or what its abort did, and it is neither any more.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, and_, case, func, insert, or_, select, update

from cloud_sync.protocol import ModelAssignment, ModelStatusReport
from fleet.db.model_tables import model_status_reports, models, rollout_devices, rollouts
from fleet.db.retention import StatusRetention
from fleet.db.schema import devices
from fleet.errors import Conflict, NotFound, Unprocessable
from fleet.registry.device_rollouts import DeviceRollouts, OnHalt, Signer
from fleet.registry.fallback import previous_versions
from fleet.registry.policy import Action, RolloutState, allowed_actions, pick_canaries, transition
from fleet.registry.store import ModelRegistry
from fleet.registry.views import RolloutCreate, RolloutDeviceOut, RolloutOut

__all__ = ["RolloutService", "Signer", "superseded"]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class RolloutService:
    """Create, steer and follow rollouts.

    Args:
        engine: The fleet database.
        registry: Where the packages are.
        signer: ``(key_id, private key)`` to sign fallback rollbacks, or None.
        halt_after_failures: Default failed-device threshold of a new rollout.
        clock: Wall clock (aware UTC).
        retention: Prunes old status reports after a report is stored (None: kept forever).
        on_halt: Called inside the halting transaction with ``(connection, {"rollout_id",
            "name", "version", "reason"})`` when a rollout halts (queues its webhook event).
    """

    def __init__(
        self,
        engine: Engine,
        registry: ModelRegistry,
        signer: Signer | None = None,
        *,
        halt_after_failures: int = 1,
        clock: Callable[[], dt.datetime] = _now,
        retention: StatusRetention | None = None,
        on_halt: OnHalt | None = None,
    ) -> None:
        self._engine = engine
        self._registry = registry
        self._signer = signer
        self._halt_after = halt_after_failures
        self._clock = clock
        self._devices = DeviceRollouts(engine, registry, signer, clock, retention, on_halt)

    # --- operator ------------------------------------------------------------------------------

    def create(self, req: RolloutCreate) -> RolloutOut:
        """Raises: NotFound (no such package), Unprocessable (target empty or unknown devices)."""
        with self._engine.begin() as conn:
            rid = self.create_in(conn, req)
        return self.get(rid)

    def create_in(self, conn: Connection, req: RolloutCreate) -> int:
        """Create the rollout inside the caller's transaction (with the package it sends, when
        that is stored in the same transaction); returns its id.

        Raises:
            NotFound: no such package (as seen by ``conn``).
            Unprocessable: target empty or unknown devices.
        """
        self._registry.get(req.name, req.version, conn)
        now = self._clock()
        active = {
            r.device_id: r
            for r in conn.execute(
                select(devices.c.device_id, devices.c.tags)
                .where(devices.c.revoked_at.is_(None))
            )
        }
        if req.tag is not None:
            target = sorted(d for d, r in active.items() if req.tag in (r.tags or []))
            if not target:
                raise Unprocessable(f"no active device has the tag {req.tag!r}")
        else:
            target = sorted(set(req.devices or []))
            unknown = [d for d in target if d not in active]
            if unknown:
                raise Unprocessable(f"unknown or revoked devices: {', '.join(unknown)}")
        previous = previous_versions(conn, target, req.name, req.version, req.stream)
        canaries = pick_canaries(target, req.canary_percent)
        state = "promoted" if len(canaries) == len(target) else "canary"
        rid = conn.execute(
            insert(rollouts).values(
                model_name=req.name, model_version=req.version, target_tag=req.tag,
                target_devices=target, stream=req.stream, canary_percent=req.canary_percent,
                halt_after_failures=req.halt_after_failures or self._halt_after,
                state=state, created_at=now, updated_at=now,
            ).returning(rollouts.c.id)
        ).scalar_one()
        conn.execute(insert(rollout_devices), [
            {
                "rollout_id": rid, "device_id": d, "canary": d in canaries,
                "assigned": d in canaries or state == "promoted",
                "previous_version": previous.get(d),
                "updated_at": now,
            }
            for d in target
        ])
        return int(rid)

    def get(self, rollout_id: int, *, with_devices: bool = True) -> RolloutOut:
        """Raises: NotFound."""
        with self._engine.connect() as conn:
            row = conn.execute(_with_model_state(select(rollouts, models.c.corrupt_reason))
                               .where(rollouts.c.id == rollout_id)).first()
            if row is None:
                raise NotFound(f"rollout {rollout_id} does not exist")
            members = conn.execute(
                select(rollout_devices).where(rollout_devices.c.rollout_id == rollout_id)
                .order_by(rollout_devices.c.device_id)
            ).all()
            versions = (_reported_versions(conn, row, [m.device_id for m in members])
                        if with_devices else {})
            newer = superseded(conn, rollout_id).get(rollout_id)
        return _out(row, members, with_devices, versions, self._signer is not None,
                    superseded_by=newer)

    def list(self) -> list[RolloutOut]:
        """Every rollout, newest first, without per-device rows: their states are counted in
        the database (a row per rollout and state, not one per device: 100 rollouts over a
        1,000-device fleet are tens of thousands of device rows)."""
        state = func.coalesce(rollout_devices.c.state, "none")
        with self._engine.connect() as conn:
            rows = conn.execute(_with_model_state(select(rollouts, models.c.corrupt_reason))
                                .order_by(rollouts.c.id.desc())).all()
            counted = conn.execute(
                select(rollout_devices.c.rollout_id, state, func.count())
                .group_by(rollout_devices.c.rollout_id, state)
            ).all()
            newer = superseded(conn)
        counts: dict[int, dict[str, int]] = {}
        for rollout_id, device_state, n in counted:
            counts.setdefault(int(rollout_id), {})[str(device_state)] = int(n)
        can = self._signer is not None
        return [_out(r, (), False, None, can, counts.get(int(r.id), {}),
                     superseded_by=newer.get(int(r.id))) for r in rows]

    def act(
        self, rollout_id: int, action: Action, expected_state: RolloutState | None = None
    ) -> RolloutOut:
        """Apply an operator action, serialised with every other action on the rollout by its
        row lock (module docstring).

        Args:
            rollout_id: The rollout.
            action: What to do.
            expected_state: The state the operator decided on; None: whatever it is now.

        Raises:
            NotFound: No such rollout.
            Conflict: The action is not allowed in the current state, the state is not
                ``expected_state`` (another operator acted first), or the rollout is superseded.
        """
        now = self._clock()
        with self._engine.begin() as conn:
            row = conn.execute(
                select(rollouts.c.state, rollouts.c.resume_state)
                .where(rollouts.c.id == rollout_id).with_for_update()
            ).first()
            if row is None:
                raise NotFound(f"rollout {rollout_id} does not exist")
            if expected_state is not None and row.state != expected_state:
                raise Conflict(f"rollout {rollout_id} is {row.state}, not {expected_state}: "
                               f"someone changed it since you looked; reload before you "
                               f"{action}")
            newer = superseded(conn, rollout_id).get(rollout_id)
            if newer is not None:
                raise Conflict(f"cannot {action} rollout {rollout_id}: it is superseded by "
                               f"rollout {newer}, which its devices follow now")
            state, resume = transition(row.state, row.resume_state, action)
            # the reason said why it halted (or what an abort did): neither holds after this
            values: dict[str, Any] = {"state": state, "resume_state": resume, "updated_at": now,
                                      "reason": None}
            if action == "abort":
                ro = conn.execute(select(rollouts).where(rollouts.c.id == rollout_id)).one()
                values["reason"] = self._devices.abort_reason(conn, ro)
            done = conn.execute(
                update(rollouts)
                .where(rollouts.c.id == rollout_id, rollouts.c.state == row.state)
                .values(**values)
            ).rowcount
            if done != 1:
                raise Conflict(f"rollout {rollout_id} changed concurrently; try again")
            if state == "promoted":
                conn.execute(
                    update(rollout_devices)
                    .where(rollout_devices.c.rollout_id == rollout_id,
                           rollout_devices.c.assigned.is_(False))
                    .values(assigned=True, updated_at=now)
                )
        return self.get(rollout_id)


    # --- device (fleet.registry.device_rollouts) ------------------------------------------------

    def assignment(self, device_id: str, stream: str | None) -> ModelAssignment | None:
        """What ``device_id`` should run on ``stream`` (None: keep what it runs);
        :meth:`fleet.registry.device_rollouts.DeviceRollouts.assignment`."""
        return self._devices.assignment(device_id, stream)

    def may_download(self, device_id: str, name: str, version: int) -> bool:
        """True when one of ``device_id``'s assignments (any stream) is ``name@version``."""
        return self._devices.may_download(device_id, name, version)

    def report(self, device_id: str, rep: ModelStatusReport) -> None:
        """Record a device's report; may halt its rollout
        (:meth:`fleet.registry.device_rollouts.DeviceRollouts.report`).

        Raises:
            Forbidden: the report names another device, or a rollout the device is not in.
            NotFound: ``rollout_id`` does not exist.
        """
        self._devices.report(device_id, rep)


def superseded(conn: Connection, rollout_id: int | None = None) -> dict[int, int]:
    """``{rollout id: superseded_by}`` of the superseded rollouts (all, or ``rollout_id`` only).

    A device follows its newest rollout whose stream is the asked one or None (every stream):
    for a rollout of stream S that is the newer of its newest rollouts of S and of None; for a
    rollout of every stream, its newest of None. A rollout is superseded when that newest one
    is newer than it for every one of its devices; ``superseded_by`` is the oldest of them.
    Two grouped reads of ``rollout_devices`` (a row per rollout and device) in the database.
    """
    rd, r = rollout_devices, rollouts
    newest_q = (select(rd.c.device_id, r.c.stream, func.max(r.c.id).label("id"))
                .select_from(rd.join(r, r.c.id == rd.c.rollout_id))
                .group_by(rd.c.device_id, r.c.stream))
    if rollout_id is not None:
        newest_q = newest_q.where(rd.c.device_id.in_(
            select(rd.c.device_id).where(rd.c.rollout_id == rollout_id).scalar_subquery()))
    newest = newest_q.cte("newest")
    every, same = newest.alias("every_stream"), newest.alias("same_stream")
    of_every, of_same = func.coalesce(every.c.id, 0), func.coalesce(same.c.id, 0)
    follows = case((of_every >= of_same, of_every), else_=of_same)
    stmt = (select(rd.c.rollout_id, func.min(follows))
            .select_from(rd.join(r, r.c.id == rd.c.rollout_id)
                         .outerjoin(every, and_(every.c.device_id == rd.c.device_id,
                                                every.c.stream.is_(None)))
                         .outerjoin(same, and_(same.c.device_id == rd.c.device_id,
                                               same.c.stream == r.c.stream)))
            .group_by(rd.c.rollout_id)
            .having(func.min(follows) > rd.c.rollout_id))
    if rollout_id is not None:
        stmt = stmt.where(rd.c.rollout_id == rollout_id)
    return {int(rid): int(newer) for rid, newer in conn.execute(stmt)}


def _reported_versions(conn: Connection, ro: Any, device_ids: Sequence[str]) -> dict[str, int]:
    """Version named by each device's newest report of rollout ``ro`` (the report its row's
    ``state`` came from: one naming the rollout, or naming its model and version)."""
    r = model_status_reports
    if not device_ids:
        return {}
    of_it = or_(r.c.rollout_id == ro.id,
                and_(r.c.rollout_id.is_(None), r.c.name == ro.model_name,
                     r.c.version == ro.model_version))
    newest = (select(r.c.device_id, func.max(r.c.pk).label("pk"))
              .where(r.c.device_id.in_(list(device_ids)), r.c.received_at >= ro.created_at,
                     of_it)
              .group_by(r.c.device_id).subquery())
    return {str(x.device_id): int(x.version) for x in conn.execute(
        select(r.c.device_id, r.c.version).join(newest, newest.c.pk == r.c.pk))}


def _with_model_state(query: Any) -> Any:
    """``query`` over ``rollouts`` joined to its package's row (``corrupt_reason``)."""
    return query.select_from(rollouts.outerjoin(models, and_(
        models.c.name == rollouts.c.model_name, models.c.version == rollouts.c.model_version)))


def _out(
    row: Any, members: Sequence[Any], with_devices: bool, versions: dict[str, int] | None = None,
    can_roll_back: bool = False, counts: Mapping[str, int] | None = None,
    superseded_by: int | None = None,
) -> RolloutOut:
    """``counts``: devices per state when the caller counted them (``members`` is then
    empty); by default counted from ``members``."""
    versions = versions or {}
    if counts is None:
        counts = Counter(m.state or "none" for m in members)
    return RolloutOut(
        id=int(row.id), name=row.model_name, version=int(row.model_version),
        target_tag=row.target_tag, target_devices=list(row.target_devices), stream=row.stream,
        canary_percent=row.canary_percent, halt_after_failures=int(row.halt_after_failures),
        state=row.state, reason=row.reason, created_at=row.created_at,
        updated_at=row.updated_at, counts=dict(sorted(counts.items())),
        can_roll_back=can_roll_back, superseded_by=superseded_by,
        model_corrupt=getattr(row, "corrupt_reason", None),
        actions=list(allowed_actions(row.state, row.resume_state, superseded_by is not None)),
        devices=[
            RolloutDeviceOut(
                device_id=m.device_id, canary=bool(m.canary), assigned=bool(m.assigned),
                previous_version=m.previous_version, state=m.state,
                version=versions.get(str(m.device_id)), reason=m.reason,
                reported_at=m.reported_at,
            )
            for m in members
        ] if with_devices else [],
    )
