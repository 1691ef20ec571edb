"""Device registry: enroll, authenticate, list, revoke, change tags.

A device token is ``secrets.token_urlsafe(32)`` (256 random bits) shown once at enrollment; only
``sha256(token)`` hex is stored. A fast unsalted hash is the right tool for high-entropy random
tokens: there is no dictionary to attack, so key stretching (bcrypt/argon2, meant for
human-chosen passwords) would only slow every request (OWASP Password Storage Cheat Sheet;
GitHub and PyPI API tokens are stored the same way).

Successful authentications may be cached per process (:class:`fleet.db.token_cache.TokenCache`,
the serving app does): :meth:`DeviceRegistry.revoke` and :meth:`DeviceRegistry.enroll` drop the
device's entries in this process at once and, on PostgreSQL, notify every other process in the
same transaction (:func:`fleet.db.invalidation.notify`); on SQLite other processes keep a
revoked token working for at most the cache's TTL (see that module for the exact semantics).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from fleet.db.invalidation import DEVICE, notify
from fleet.db.schema import devices
from fleet.db.token_cache import TokenCache
from fleet.errors import Conflict, NotFound, Unprocessable

Clock = Callable[[], dt.datetime]
#: What a device tag may look like (``line=3``, ``site/plant-a``).
TAG_PATTERN = re.compile(r"^[A-Za-z0-9_.:=/-]{1,64}$")
#: Most tags one device may carry (as ``EnrollRequest.tags``).
MAX_TAGS = 32


def change_tags(tags: Sequence[str], add: Sequence[str], remove: Sequence[str]) -> list[str]:
    """``tags`` with ``remove`` taken out, then ``add`` put in (sorted, no repeats).

    A removed ``k`` also takes out every ``k=...`` tag; an added ``k=v`` replaces the device's
    other ``k=...`` tags (a key holds one value).

    >>> change_tags(["line=3", "site/a", "pump"], add=["line=4"], remove=["pump"])
    ['line=4', 'site/a']
    >>> change_tags(["line=3", "site/a"], add=[], remove=["line"])
    ['site/a']
    """
    keep = [t for t in tags
            if not any(t == r or t.startswith(r + "=") for r in remove)]
    for tag in add:
        if "=" in tag:
            key = tag.split("=", 1)[0] + "="
            keep = [t for t in keep if not t.startswith(key)]
        keep.append(tag)
    return sorted(set(keep))


def utcnow() -> dt.datetime:
    """Aware UTC now (the default clock)."""
    return dt.datetime.now(dt.timezone.utc)


def hash_token(token: str) -> str:
    """sha256 hex digest of a token (64 lowercase hex characters)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Device:
    """One row of ``devices`` as operators see it (never the token hash)."""

    device_id: str
    tags: list[str]
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    last_seen: dt.datetime | None
    agent_version: str | None
    model_name: str | None
    model_version: int | None
    backlog_alerts: int | None
    backlog_aggregates: int | None

    @classmethod
    def from_row(cls, row: Any) -> Device:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})


class DeviceRegistry:
    """Devices in the database.

    Args:
        engine: The SQLAlchemy engine.
        clock: Returns aware UTC now (injected for tests).
        token_cache: Where successful authentications are remembered (None: every
            :meth:`authenticate` asks the database).
    """

    def __init__(
        self, engine: Engine, clock: Clock = utcnow, token_cache: TokenCache | None = None
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._cache = token_cache

    def enroll(self, device_id: str, tags: list[str]) -> str:
        """Register ``device_id`` (or re-enroll a revoked one) and return its new token.

        Raises:
            Conflict: The device is enrolled and not revoked.
            Unprocessable: A tag does not match :data:`TAG_PATTERN`.
        """
        bad = [t for t in tags if not TAG_PATTERN.match(t)]
        if bad:
            raise Unprocessable(f"tags must match {TAG_PATTERN.pattern}: {bad[:5]!r}")
        token = secrets.token_urlsafe(32)
        values = {
            "token_hash": hash_token(token),
            "tags": sorted(set(tags)),
            "created_at": self._clock(),
            "revoked_at": None,
        }
        try:
            self._enroll(device_id, values)
        except IntegrityError:  # a concurrent enrollment of the same id won
            raise Conflict(f"device {device_id!r} is already enrolled") from None
        if self._cache is not None:  # the previous token (revoked) is no longer valid
            self._cache.drop_device(device_id)
        return token

    def _enroll(self, device_id: str, values: dict[str, Any]) -> None:
        with self._engine.begin() as conn:
            row = conn.execute(
                select(devices.c.revoked_at).where(devices.c.device_id == device_id)
                .with_for_update()
            ).first()
            if row is None:
                conn.execute(insert(devices).values(device_id=device_id, **values))
            elif row.revoked_at is None:
                raise Conflict(f"device {device_id!r} is already enrolled (revoke it first)")
            else:
                conn.execute(
                    update(devices).where(devices.c.device_id == device_id).values(**values)
                )
                notify(conn, DEVICE, device_id)  # the old token is gone everywhere

    def authenticate_cached(self, token: str) -> str | None:
        """The device id the token cache holds for ``token``, else ``None`` (no I/O: a ``None``
        means "ask :meth:`authenticate`", not "refused")."""
        return None if self._cache is None else self._cache.get(hash_token(token))

    def authenticate(self, token: str) -> str | None:
        """The id of the active device owning ``token``, else ``None``.

        Served from the token cache when it holds the token; a database hit is cached.

        Raises:
            sqlalchemy.exc.OperationalError: The database failed (mapped to 503 by the API).
        """
        digest = hash_token(token)
        generation = 0
        if self._cache is not None:
            cached = self._cache.get(digest)
            if cached is not None:
                return cached
            generation = self._cache.generation()
        # one statement: autocommit spares the BEGIN and ROLLBACK round trips
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            row = conn.execute(
                select(devices.c.device_id, devices.c.token_hash).where(
                    devices.c.token_hash == digest, devices.c.revoked_at.is_(None)
                )
            ).first()
        if row is None or not hmac.compare_digest(row.token_hash, digest):
            return None
        device_id = str(row.device_id)
        if self._cache is not None:
            self._cache.put(digest, device_id, generation)
        return device_id

    def get(self, device_id: str) -> Device | None:
        """One device (revoked ones included), or ``None``."""
        with self._engine.connect() as conn:
            row = conn.execute(select(devices).where(devices.c.device_id == device_id)).first()
        return None if row is None else Device.from_row(row)

    def list(self, *, include_revoked: bool = False) -> list[Device]:
        """All devices ordered by id."""
        query = select(devices).order_by(devices.c.device_id)
        if not include_revoked:
            query = query.where(devices.c.revoked_at.is_(None))
        with self._engine.connect() as conn:
            return [Device.from_row(row) for row in conn.execute(query)]

    def set_tags(self, device_id: str, add: Sequence[str], remove: Sequence[str]) -> Device:
        """Change an active device's tags (:func:`change_tags`); the token stays valid.

        Returns:
            The device afterwards.

        Raises:
            NotFound: No active device with this id.
            Unprocessable: A tag does not match :data:`TAG_PATTERN`, or more than
                :data:`MAX_TAGS` tags would result.
        """
        bad = [t for t in [*add, *remove] if not TAG_PATTERN.match(t)]
        if bad:
            raise Unprocessable(f"tags must match {TAG_PATTERN.pattern}: {bad[:5]!r}")
        with self._engine.begin() as conn:
            row = conn.execute(
                select(devices.c.tags).where(devices.c.device_id == device_id,
                                             devices.c.revoked_at.is_(None))
                .with_for_update()
            ).first()
            if row is None:
                raise NotFound(f"no active device {device_id!r}")
            tags = change_tags(list(row.tags or []), add, remove)
            if len(tags) > MAX_TAGS:
                raise Unprocessable(f"a device carries at most {MAX_TAGS} tags "
                                    f"({len(tags)} asked)")
            conn.execute(update(devices).where(devices.c.device_id == device_id)
                         .values(tags=tags))
        found = self.get(device_id)
        assert found is not None
        return found

    def revoke(self, device_id: str) -> None:
        """Invalidate the device's token; its records stay.

        The token is refused at once by this registry and, on PostgreSQL, by every process
        listening for invalidations once this commits; on SQLite other processes' token caches
        accept it for at most their TTL (module docstring).

        Raises:
            NotFound: No active device with this id.
        """
        with self._engine.begin() as conn:
            result = conn.execute(
                update(devices)
                .where(devices.c.device_id == device_id, devices.c.revoked_at.is_(None))
                .values(revoked_at=self._clock(), token_hash=None)
            )
            if result.rowcount:
                notify(conn, DEVICE, device_id)  # delivered when this transaction commits
        if self._cache is not None:
            self._cache.drop_device(device_id)
        if result.rowcount == 0:
            raise NotFound(f"no active device {device_id!r}")
