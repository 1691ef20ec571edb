"""The device side of rollouts: what a device is assigned, which packages it may download,
and its status reports (which may halt a rollout). :class:`fleet.registry.rollouts.
RolloutService` (the operator side) delegates to :class:`DeviceRollouts`.

* Assignment (``GET /v1/models/assignment``): the device's NEWEST rollout whose stream matches
  (the asked stream or None) decides. canary/promoted and the device assigned and not failed:
  that version. paused/halted: nothing (204: keep what runs). aborted: a device that has not
  made the version active (no report, downloaded, verified, accepted, shadow) and ran an older
  registry version before gets that version again, unsigned (it still runs it: the agent drops the
  candidate). A device active on the version (its report or its model columns) gets the older
  version with a :class:`~cloud_sync.protocol.SignedRollback` for this device and the asked
  stream, signed at each request (fresh ``issued_at``) by the fleet's rollback key
  (``--rollback-key``, never the package key); without one, nothing (it keeps the version).
  The previous version and what an abort does per device: :mod:`fleet.registry.fallback`.
* Downloads (``GET /v1/models/<name>/<version>/package``): a device gets only a package that
  one of its assignments names (:meth:`DeviceRollouts.may_download`).
* Reports (``POST /v1/models/status``): stored in ``model_status_reports``; the device's row of
  the rollout gets the state and reason; ``active`` also updates the device's model columns.
  When the failed devices (rejected/rolled_back; canary devices only while in canary) reach
  ``halt_after_failures``, the rollout becomes ``halted`` (one conditional UPDATE, so concurrent
  reports halt it once).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    update,
)

from cloud_sync.package import sign_rollback
from cloud_sync.protocol import ModelAssignment, ModelStatusReport
from fleet.db.model_tables import model_status_reports, rollout_devices, rollouts
from fleet.db.retention import StatusRetention
from fleet.db.schema import devices
from fleet.errors import Forbidden, NotFound
from fleet.registry.fallback import abort_outcome, active_on, fill_previous
from fleet.registry.policy import ASSIGNING, FAILED, should_halt
from fleet.registry.store import ModelRegistry

#: ``(key_id, private key)`` that signs fallback rollbacks (the fleet's rollback key).
Signer = tuple[str, Ed25519PrivateKey]
#: Called inside the halting transaction with ``(connection, {"rollout_id", "name", "version",
#: "reason"})`` when a rollout halts.
OnHalt = Callable[[Connection, dict[str, Any]], object]


def package_url(name: str, version: int) -> str:
    """Path of a package archive, relative to the fleet base URL."""
    return f"/v1/models/{name}/{version}/package"


def _newest_query(every_stream: bool) -> Select[Any]:
    """The newest rollout of the device ``:device_id`` for the stream ``:stream`` or for every
    stream (a rollout without a stream applies to all), with its member row and the device's
    reported model. Built once per shape (:data:`_NEWEST`): an assignment poll only binds the
    parameters (building the statement was about a third of a poll's CPU in the service)."""
    streams: ColumnElement[bool] = rollouts.c.stream.is_(None)
    if not every_stream:
        streams = or_(streams, rollouts.c.stream == bindparam("stream"))
    return (select(rollouts, rollout_devices.c.assigned, rollout_devices.c.previous_version,
                   rollout_devices.c.state.label("device_state"),
                   devices.c.model_name.label("device_model"),
                   devices.c.model_version.label("device_version"))
            .join(rollout_devices, rollout_devices.c.rollout_id == rollouts.c.id)
            .join(devices, devices.c.device_id == rollout_devices.c.device_id)
            .where(rollout_devices.c.device_id == bindparam("device_id"), streams)
            .order_by(rollouts.c.id.desc()).limit(1))


#: :func:`_newest_query` by "every stream" (``stream`` None) or one stream.
_NEWEST = {True: _newest_query(True), False: _newest_query(False)}


class DeviceRollouts:
    """Assignments, download permissions and status reports of the devices.

    Args:
        engine: The fleet database.
        registry: Where the packages are.
        signer: Signs fallback rollbacks, or None (an abort then only stops assigning).
        clock: Wall clock (aware UTC).
        retention: Prunes old status reports after a report is stored (None: kept forever).
        on_halt: Called when a rollout halts (queues its webhook event).
    """

    def __init__(
        self,
        engine: Engine,
        registry: ModelRegistry,
        signer: Signer | None,
        clock: Callable[[], dt.datetime],
        retention: StatusRetention | None = None,
        on_halt: OnHalt | None = None,
    ) -> None:
        self._engine = engine
        self._registry = registry
        self._signer = signer
        self._clock = clock
        self._retention = retention
        self._on_halt = on_halt

    def abort_reason(self, conn: Connection, ro: Any) -> str:
        """The ``reason`` line of the aborted rollout row ``ro``: what its abort does per
        device (:func:`fleet.registry.fallback.abort_outcome`)."""
        return abort_outcome(conn, ro, lambda v: self._registry.exists(ro.model_name, v),
                             self._signer is not None)

    def assignment(self, device_id: str, stream: str | None) -> ModelAssignment | None:
        """What ``device_id`` should run on ``stream`` (None: keep what it runs)."""
        row = self._newest(device_id, stream)
        target = self._target(row)
        if target is None:
            return None
        version, is_rollback = target
        if not is_rollback or self._signer is None:
            return self._assign(row, version, None)
        key_id, key = self._signer
        rollback = sign_rollback(
            key, key_id, rollout_id=int(row.id), device_id=device_id, stream=stream,
            name=row.model_name,
            from_version=int(row.model_version), to_version=version,
            clock=lambda: self._clock().timestamp(),
        )
        return self._assign(row, version, rollback)

    def may_download(self, device_id: str, name: str, version: int) -> bool:
        """True when one of ``device_id``'s assignments (any stream) is ``name@version``."""
        with self._engine.connect() as conn:
            streams = set(conn.execute(
                select(rollouts.c.stream).distinct()
                .join(rollout_devices, rollout_devices.c.rollout_id == rollouts.c.id)
                .where(rollout_devices.c.device_id == device_id, rollouts.c.model_name == name)
            ).scalars())
        for stream in sorted(streams, key=lambda s: s or ""):
            row = self._newest(device_id, stream)
            target = self._target(row)
            if target is not None and row.model_name == name and target[0] == version:
                return True
        return False

    def _newest(self, device_id: str, stream: str | None) -> Any:
        """The device's newest rollout for ``stream`` (or every stream), with its member row."""
        params = {"device_id": device_id} if stream is None else {
            "device_id": device_id, "stream": stream}
        # one statement: autocommit spares a poll the BEGIN and ROLLBACK round trips
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return conn.execute(_NEWEST[stream is None], params).first()

    def _target(self, row: Any) -> tuple[int, bool] | None:
        """``(version, is_rollback)`` a rollout row assigns its device, or None."""
        if row is None:
            return None
        if row.state in ASSIGNING:
            if not row.assigned or row.device_state in FAILED:
                return None
            return int(row.model_version), False
        if row.state != "aborted" or row.previous_version is None:
            return None
        prev = int(row.previous_version)
        if not self._registry.exists(row.model_name, prev):
            return None
        if not active_on(row.device_state, row.device_model, row.device_version,
                         row.model_name, int(row.model_version)):
            # never activated the aborted version: it still runs prev, no rollback to sign;
            # the assignment of prev tells an agent in download/accept/shadow to stop
            return (prev, False) if row.assigned else None
        if self._signer is None:
            return None
        return prev, True

    def _assign(self, row: Any, version: int, rollback: Any) -> ModelAssignment:
        rec = self._registry.get(row.model_name, version)
        return ModelAssignment(
            rollout_id=int(row.id), stream=row.stream, name=rec.name, version=rec.version,
            archive_sha256=rec.archive_sha256, archive_size=rec.size,
            url=package_url(rec.name, rec.version), rollback=rollback,
        )

    def report(self, device_id: str, rep: ModelStatusReport) -> None:
        """Record a device's report; may halt its rollout.

        Raises:
            Forbidden: the report names another device, or a rollout the device is not in.
            NotFound: ``rollout_id`` does not exist.
        """
        if rep.device_id != device_id:
            raise Forbidden("a device can only report for itself")
        self._store_report(device_id, rep)
        if self._retention is not None:
            self._retention.maybe_prune()

    def _store_report(self, device_id: str, rep: ModelStatusReport) -> None:
        now = self._clock()
        with self._engine.begin() as conn:
            conn.execute(insert(model_status_reports).values(
                device_id=device_id, rollout_id=rep.rollout_id, stream=rep.stream, name=rep.name,
                version=rep.version, state=rep.state, reason=rep.reason, details=rep.details,
                at=rep.at, received_at=now,
            ))
            if rep.state == "active":
                conn.execute(update(devices).where(devices.c.device_id == device_id)
                             .values(model_name=rep.name, model_version=rep.version))
            ro = self._find_rollout(conn, device_id, rep)
            if ro is None or ro.model_name != rep.name:
                return
            fill_previous(conn, ro, device_id, now)
            state, reason = rep.state, rep.reason
            if ro.state == "aborted" and rep.state == "active" and rep.version != ro.model_version:
                state, reason = "rolled_back", f"abort: back on {rep.name}@{rep.version}"
            conn.execute(
                update(rollout_devices)
                .where(rollout_devices.c.rollout_id == ro.id,
                       rollout_devices.c.device_id == device_id)
                .values(state=state, reason=reason, reported_at=now, updated_at=now)
            )
            if ro.state == "aborted":  # the reason line follows the devices' outcomes
                conn.execute(update(rollouts).where(rollouts.c.id == ro.id).values(
                    reason=self.abort_reason(conn, ro), updated_at=now))
            if rep.state in FAILED and rep.version == ro.model_version:
                self._maybe_halt(conn, ro, now)

    def _find_rollout(self, conn: Connection, device_id: str, rep: ModelStatusReport) -> Any:
        member = and_(rollout_devices.c.rollout_id == rollouts.c.id,
                      rollout_devices.c.device_id == device_id)
        if rep.rollout_id is not None:
            ro = conn.execute(select(rollouts).where(rollouts.c.id == rep.rollout_id)).first()
            if ro is None:
                raise NotFound(f"rollout {rep.rollout_id} does not exist")
            if conn.execute(select(func.count()).where(member, rollouts.c.id == ro.id)
                            ).scalar_one() == 0:
                raise Forbidden(f"device {device_id} is not in rollout {rep.rollout_id}")
            return ro
        return conn.execute(
            select(rollouts).where(member, rollouts.c.model_name == rep.name,
                                   rollouts.c.model_version == rep.version)
            .order_by(rollouts.c.id.desc()).limit(1)
        ).first()

    def _maybe_halt(self, conn: Connection, ro: Any, now: dt.datetime) -> None:
        if ro.state not in ASSIGNING:
            return
        q = select(rollout_devices.c.device_id, rollout_devices.c.reason).where(
            rollout_devices.c.rollout_id == ro.id, rollout_devices.c.state.in_(FAILED)
        )
        if ro.state == "canary":
            q = q.where(rollout_devices.c.canary.is_(True))
        failed = conn.execute(q.order_by(rollout_devices.c.device_id)).all()
        if not should_halt(len(failed), int(ro.halt_after_failures)):
            return
        why = "; ".join(f"{f.device_id}: {f.reason or 'no reason given'}" for f in failed[:5])
        reason = f"halted: {len(failed)} device(s) failed ({why})"[:2000]
        halted = conn.execute(
            update(rollouts).where(rollouts.c.id == ro.id, rollouts.c.state.in_(ASSIGNING))
            .values(state="halted", resume_state=None, updated_at=now, reason=reason)
        ).rowcount
        if halted and self._on_halt is not None:
            self._on_halt(conn, {"rollout_id": int(ro.id), "name": ro.model_name,
                                 "version": int(ro.model_version), "reason": reason})
