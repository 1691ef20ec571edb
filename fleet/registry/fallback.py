"""Where an abort sends each device: the version it ran before, and what the abort will do.

The version a device ran before a rollout of ``name@version`` (``rollout_devices.
previous_version``) is its newest ``active`` report of ``name`` for another version, on the
rollout's stream when it targets one (:func:`previous_versions`); without such a report, the
device's model columns (last ``active`` report of any stream). Agents report the package each
stream runs when they start (``details.origin`` ``configured`` for the package of their config,
e.g. ``builtin:skab-wstat``), so the first rollout from a builtin model has a version to fall
back to. A device that had reported nothing when the rollout was created gets it from its first
report of that rollout (:func:`fill_previous`).

An abort stops every device that has not made the aborted version active (downloaded,
verified, accepted, shadow, or no report yet): its assignment goes back to its previous version,
the one it still runs, with no rollback signature (nothing is rolled back; the agent drops the
candidate). A device already active on the aborted version is sent back only when all of these
hold (:func:`abort_outcome` says which one is missing, per device, in the rollout's ``reason``,
refreshed as devices report): its previous version is known, that version is in the registry
(pushed signed, like any package), and the fleet has a rollback key (``--rollback-key``;
agents must trust its ``.pub``); otherwise it keeps the aborted version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, func, or_, select, update

from fleet.db.model_tables import model_status_reports, rollout_devices
from fleet.db.schema import devices

_R = model_status_reports


def previous_versions(
    conn: Connection, device_ids: Sequence[str], name: str, version: int, stream: str | None
) -> dict[str, int]:
    """The version of ``name`` each device ran before ``name@version`` (devices without one
    are left out).

    Args:
        conn: Open connection.
        device_ids: The devices.
        name: Model name.
        version: The rollout's version (never its own previous one).
        stream: The rollout's stream, or None (every stream).
    """
    if not device_ids:
        return {}
    cond = [_R.c.device_id.in_(list(device_ids)), _R.c.name == name, _R.c.state == "active",
            _R.c.version != version]
    if stream is not None:
        cond.append(or_(_R.c.stream == stream, _R.c.stream.is_(None)))
    newest = (select(_R.c.device_id, func.max(_R.c.pk).label("pk")).where(*cond)
              .group_by(_R.c.device_id).subquery())
    found = {
        str(r.device_id): int(r.version)
        for r in conn.execute(select(_R.c.device_id, _R.c.version)
                              .join(newest, newest.c.pk == _R.c.pk))
    }
    rest = [d for d in device_ids if d not in found]
    if rest:
        for r in conn.execute(
            select(devices.c.device_id, devices.c.model_version)
            .where(devices.c.device_id.in_(rest), devices.c.model_name == name,
                   devices.c.model_version.is_not(None), devices.c.model_version != version)
        ):
            found[str(r.device_id)] = int(r.model_version)
    return found


def fill_previous(conn: Connection, ro: Any, device_id: str, now: Any) -> None:
    """Record the device's previous version in rollout ``ro`` if it is not known yet."""
    prev = conn.execute(
        select(rollout_devices.c.previous_version).where(
            rollout_devices.c.rollout_id == ro.id, rollout_devices.c.device_id == device_id)
    ).scalar_one_or_none()
    if prev is not None:
        return
    found = previous_versions(conn, [device_id], ro.model_name, int(ro.model_version), ro.stream)
    if device_id in found:
        conn.execute(
            update(rollout_devices)
            .where(rollout_devices.c.rollout_id == ro.id,
                   rollout_devices.c.device_id == device_id)
            .values(previous_version=found[device_id], updated_at=now)
        )


def active_on(
    state: str | None, device_model: str | None, device_version: int | None, name: str,
    version: int,
) -> bool:
    """Whether a device has made ``name@version`` active: its report in the rollout is
    ``active``, or its model columns name it. A device that only downloaded, accepted or
    shadows it still runs its previous version (an abort needs no signed rollback for it)."""
    return state == "active" or (device_model == name and device_version == version)


def abort_outcome(
    conn: Connection, ro: Any, in_registry: Callable[[int], bool], can_sign: bool,
) -> str:
    """What an abort of ``ro`` does, per device, as one line for the rollout's ``reason``.

    Args:
        conn: Open connection.
        ro: The rollout row.
        in_registry: Whether a version of the rollout's model is in the registry.
        can_sign: The fleet has a rollback signing key.

    Returns:
        E.g. ``aborted by the operator: back to skab-wstat@1: gw1; keep skab-wstat@2 (not in
        the registry: skab-wstat@1, push it signed): gw2; untouched (never ran it): gw3``.
    """
    members = conn.execute(
        select(rollout_devices, devices.c.model_name.label("device_model"),
               devices.c.model_version.label("device_version"))
        .join(devices, devices.c.device_id == rollout_devices.c.device_id)
        .where(rollout_devices.c.rollout_id == ro.id).order_by(rollout_devices.c.device_id)
    ).all()
    label = f"{ro.model_name}@{ro.model_version}"
    groups: dict[str, list[str]] = {}
    for m in members:
        prev = m.previous_version
        active = active_on(m.state, m.device_model, m.device_version, ro.model_name,
                           int(ro.model_version))
        if m.state == "rolled_back":
            why = f"rolled back ({m.reason or 'no reason given'})"
        elif not active and m.assigned and prev is not None and in_registry(int(prev)):
            why = (f"stopped before activating {label}: assigned {ro.model_name}@{prev} "
                   "again (no rollback needed)")
        elif not active and (m.state is None or not m.assigned):
            why = "untouched (never ran it)"
        elif not active:
            why = (f"stopped before activating {label}: no assignment (keeps the version "
                   "it runs)")
        elif prev is None:
            why = (f"keep {label} (no previous version known: the device never reported "
                   f"another version of {ro.model_name})")
        elif not in_registry(int(prev)):
            why = (f"keep {label} ({ro.model_name}@{prev} is not in the registry: push it "
                   "signed)")
        elif not can_sign:
            why = (f"keep {label} (the fleet has no --rollback-key to sign the rollback: "
                   f"start edge-fleet serve with --rollback-key; docs/rollouts.md)")
        else:
            why = f"back to {ro.model_name}@{prev}"
        groups.setdefault(why, []).append(str(m.device_id))
    parts = [f"{why}: {', '.join(ids[:20])}{' ...' if len(ids) > 20 else ''}"
             for why, ids in groups.items()]
    return ("aborted by the operator: " + "; ".join(parts))[:2000]
