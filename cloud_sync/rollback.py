"""Anti-rollback: when a package needs a signed rollback, and whether the one it has is valid.

The rule (per stream, per model name): a package needs a :class:`~cloud_sync.protocol.
SignedRollback` when its version is older than the newest version of that name the stream has
ever run (its high-water mark, kept by the device across restarts), or, for the name the stream
runs now, not newer than the running version. Switching between names does not reset a name's
mark: a stream that ran ``skab-wstat@6``, then ``skab-other@1``, still needs a rollback for
``skab-wstat@1``.

A rollback is valid only when all of these hold:

* it names this device, this stream, this model name, ``from_version`` equal to the mark and
  ``to_version`` equal to the package's version, and ``rollout_id`` equal to the assignment's
  (it belongs to exactly one assignment);
* its rollout is newer than the rollout of the last SIGNED rollback the stream applied (the
  device's rollback mark, kept across restarts): a rollback is applied at most once, and an
  older one never after a newer one. Only a verified rollback's own, signed ``rollout_id``
  raises this mark, never an assignment's (unsigned) ``rollout_id``: a hostile fleet that
  installed a genuine package under ``rollout_id = 2**63 - 1`` raised the previous,
  install-based mark for good and so switched every later genuine rollback off. Rollout ids
  grow; a fleet whose database was recreated starts again at 1, and its rollbacks are refused
  until its ids pass the device's mark (the message says so);
* it was issued (its signed ``issued_at``) no more than ``max_skew_s`` before the stream's last
  fleet install (device clock): a rollback captured before the stream moved on cannot be
  replayed after it, even within its age and even if this device never applied it. The fleet
  signs afresh at every poll, so a genuine abort of the package just installed passes;
* it carries a ``rollout_id`` at all: a rollback signed by an older fleet (without one) is
  refused, with a message asking to upgrade the fleet;
* its ``issued_at`` is at most ``max_age_s`` old and at most ``max_skew_s`` in the future on
  the device's clock (it expires, so a captured one cannot be replayed later);
* its Ed25519 signature verifies with a key of the ROLLBACK trust set, which is separate from
  the package-signing keys: the fleet's rollback key lives on the server, and whoever holds the
  server must not be able to sign a package with it (nor a package signer a rollback).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cloud_sync.errors import RollbackRefused, SignatureError
from cloud_sync.protocol import SignedRollback
from cloud_sync.signing import TrustedKeys, verify_rollback

#: Default largest age of a rollback's ``issued_at``, seconds (the fleet signs at every poll).
DEFAULT_MAX_AGE_S = 3600.0
#: Default tolerance for an ``issued_at`` ahead of the device clock, seconds.
DEFAULT_MAX_SKEW_S = 300.0


@dataclass(frozen=True)
class RollbackPolicy:
    """How a device checks rollbacks.

    Attributes:
        keys: The rollback trust set ``{key_id: public key}`` (empty: every rollback refused).
        max_age_s: Largest age of ``issued_at``, seconds.
        max_skew_s: Largest ``issued_at`` ahead of the device clock, seconds.
    """

    keys: TrustedKeys
    max_age_s: float = DEFAULT_MAX_AGE_S
    max_skew_s: float = DEFAULT_MAX_SKEW_S


def rollback_floor(
    name: str, version: int, running: tuple[str, int] | None, high_water: Mapping[str, int]
) -> int | None:
    """The ``from_version`` a rollback must name for ``name@version``, or None: none needed.

    Args:
        name: Model name of the package.
        version: Its version.
        running: ``(name, version)`` the stream runs now, if known.
        high_water: Newest version per model name the stream has run.
    """
    mark = high_water.get(name)
    if running is not None and running[0] == name:
        floor = max(mark or 0, running[1])
        return floor if version <= floor else None
    return mark if mark is not None and version < mark else None


def check_rollback(
    rollback: SignedRollback | None,
    *,
    device_id: str | None,
    stream: str | None,
    name: str,
    from_version: int,
    to_version: int,
    policy: RollbackPolicy | None,
    now: float,
    where: str,
    rollout_id: int | None = None,
    rollback_mark: int | None = None,
    installed_at: float | None = None,
) -> None:
    """Refuse unless ``rollback`` allows ``name`` from ``from_version`` down to ``to_version``.

    Args:
        rollback: The assignment's rollback, if any.
        device_id: This device (None: refused, the binding cannot be checked).
        stream: The stream the package is for (None: refused).
        name: Model name of the package.
        from_version: The mark :func:`rollback_floor` returned.
        to_version: The package's version.
        policy: Rollback keys and ages (None: no rollback keys configured, every one refused).
        now: Device wall clock, epoch seconds UTC.
        where: ``name@version`` for the error.
        rollout_id: The assignment's ``rollout_id`` (None: refused, nothing to bind to).
        rollback_mark: The rollout id of the last signed rollback the stream applied (None:
            none yet).
        installed_at: When the stream last installed a fleet package, device clock (None:
            never).

    Raises:
        RollbackRefused: absent, not bound to a rollout (an older fleet's), for another
            rollout/device/stream/name/versions, of a rollout not newer than
            ``rollback_mark`` or issued before ``installed_at`` (a replay), expired, from
            the future, signed by a key outside the rollback trust set, or a bad signature.
    """
    refuse = (f"version {to_version} is not newer than version {from_version} of {name} "
              "this stream ran")
    if rollback is None:
        raise RollbackRefused(f"{refuse} and no signed rollback allows it", where)
    if policy is None or not policy.keys:
        raise RollbackRefused(f"{refuse}; no rollback keys are configured on this device "
                              "(updater.rollback_keys_dir), so no rollback is accepted", where)
    want = (device_id, stream, name, from_version, to_version)
    got = (rollback.device_id, rollback.stream, rollback.name, rollback.from_version,
           rollback.to_version)
    if device_id is None or stream is None or got != want:
        raise RollbackRefused(
            f"{refuse}; the rollback is for device/stream/name/from/to {got}, not {want}", where
        )
    if rollback.rollout_id is None:
        raise RollbackRefused(
            f"{refuse}; the rollback names no rollout_id: it was signed by a fleet older than "
            "this agent, whose rollbacks could be replayed; upgrade the fleet", where)
    if rollout_id is None or rollback.rollout_id != rollout_id:
        raise RollbackRefused(
            f"{refuse}; the rollback is for rollout {rollback.rollout_id}, not this "
            f"assignment's rollout {rollout_id}", where)
    if rollback_mark is not None and rollback.rollout_id <= rollback_mark:
        raise RollbackRefused(
            f"{refuse}; the rollback undoes rollout {rollback.rollout_id}, but this stream has "
            f"already applied a signed rollback of rollout {rollback_mark}: a replayed rollback "
            "(a fleet whose database was recreated must pass that rollout id first)", where)
    age = now - rollback.issued_at
    if age > policy.max_age_s:
        raise RollbackRefused(
            f"{refuse}; the rollback expired: issued {age:.0f} s ago, at most "
            f"{policy.max_age_s:.0f} s (updater.rollback_max_age_s)", where)
    if -age > policy.max_skew_s:
        raise RollbackRefused(
            f"{refuse}; the rollback is issued {-age:.0f} s in the future (device clock), at "
            f"most {policy.max_skew_s:.0f} s", where)
    skew = policy.max_skew_s
    if installed_at is not None and rollback.issued_at < min(installed_at, now) - skew:
        raise RollbackRefused(
            f"{refuse}; the rollback was issued {min(installed_at, now) - rollback.issued_at:.0f}"
            " s before this stream last installed a package: the stream has moved on since, a "
            "replayed rollback", where)
    if rollback.key_id not in policy.keys:
        raise RollbackRefused(
            f"{refuse}; the rollback is signed by key {rollback.key_id!r}, which is not a "
            "trusted rollback key (package keys never sign rollbacks)", where)
    try:
        verify_rollback(rollback, policy.keys)
    except SignatureError as exc:
        raise RollbackRefused(f"{refuse}; the rollback is not valid: {exc}", where) from exc
