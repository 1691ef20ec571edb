"""Browser sessions (server-side, in the database) and the login backoff.

A session cookie holds ``secrets.token_urlsafe(32)``; the database keeps only its sha256 hex, the
user, an absolute expiry and the session's CSRF token (``secrets.token_urlsafe(32)``, the
double-submit value: the console reads it from the non-HttpOnly ``edge_fleet_csrf`` cookie and
sends it back in ``X-CSRF-Token``; :func:`fleet.api.deps.get_principal` compares it with the
stored one using :func:`hmac.compare_digest`). A session of a user disabled or deleted since
stops working at once (the lookup joins ``users``).

Login backoff (OWASP Authentication Cheat Sheet, "Login Throttling"): failures are counted per
(username, client address). After :data:`FREE_ATTEMPTS` failures each further attempt must wait
``min(BASE_DELAY_S * 2 ** (failures - FREE_ATTEMPTS), MAX_DELAY_S)`` seconds after the last
failure, else it is refused with 429 and ``Retry-After`` without checking the password. A
success clears the count. Counts live in the database, so every worker process shares them.
"""

from __future__ import annotations

import datetime as dt
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from fleet.accounts.roles import Role, parse_role
from fleet.db.account_tables import login_failures, sessions, users
from fleet.db.devices import hash_token, utcnow
from fleet.errors import TooManyRequests

#: Failed logins allowed per (user, address) before the backoff starts.
FREE_ATTEMPTS = 3
BASE_DELAY_S = 1.0
MAX_DELAY_S = 300.0
#: Longest stored client address (IPv6 text is at most 45 characters).
_ADDRESS_CHARS = 64


@dataclass(frozen=True)
class SessionInfo:
    """A valid session: whose, with which role, its CSRF token and expiry."""

    username: str
    role: Role
    csrf_token: str
    expires_at: dt.datetime


def backoff_s(failures: int) -> float:
    """Seconds to wait after ``failures`` failed logins (0 within the free attempts).

    >>> [backoff_s(n) for n in (0, 3, 4, 5, 20)]
    [0.0, 1.0, 2.0, 4.0, 300.0]
    """
    if failures < FREE_ATTEMPTS:
        return 0.0
    return min(BASE_DELAY_S * 2.0 ** min(failures - FREE_ATTEMPTS, 32), MAX_DELAY_S)


class SessionStore:
    """Sessions in the fleet database.

    Args:
        engine: The fleet database.
        ttl_s: Lifetime of a session from login, seconds (absolute, not sliding).
        clock: Aware UTC now.
    """

    def __init__(
        self, engine: Engine, ttl_s: float, clock: Callable[[], dt.datetime] = utcnow
    ) -> None:
        self._engine = engine
        self._ttl = dt.timedelta(seconds=ttl_s)
        self._clock = clock

    def create(self, username: str, address: str | None) -> tuple[str, SessionInfo]:
        """A new session for ``username``: ``(cookie value, info)``. Expired rows are purged."""
        value, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        now = self._clock()
        with self._engine.begin() as conn:
            conn.execute(delete(sessions).where(sessions.c.expires_at <= now))
            conn.execute(insert(sessions).values(
                id_hash=hash_token(value), username=username, csrf_token=csrf, created_at=now,
                expires_at=now + self._ttl,
                address=None if address is None else address[:_ADDRESS_CHARS],
            ))
        info = self.lookup(value)
        assert info is not None
        return value, info

    def lookup(self, value: str) -> SessionInfo | None:
        """The unexpired session of an active user with this cookie value, else None."""
        with self._engine.connect() as conn:
            row = conn.execute(
                select(sessions.c.username, sessions.c.csrf_token, sessions.c.expires_at,
                       users.c.role)
                .join(users, users.c.username == sessions.c.username)
                .where(sessions.c.id_hash == hash_token(value),
                       sessions.c.expires_at > self._clock(), users.c.disabled_at.is_(None))
            ).first()
        if row is None:
            return None
        return SessionInfo(username=row.username, role=parse_role(row.role),
                           csrf_token=row.csrf_token, expires_at=row.expires_at)

    def delete(self, value: str) -> None:
        """End a session (a no-op when it is unknown)."""
        with self._engine.begin() as conn:
            conn.execute(delete(sessions).where(sessions.c.id_hash == hash_token(value)))

    def delete_user(self, username: str) -> None:
        """End every session of ``username`` (password change, disable)."""
        with self._engine.begin() as conn:
            conn.execute(delete(sessions).where(sessions.c.username == username))


class LoginThrottle:
    """Failed-login counts per (username, address) and the backoff they impose.

    Args:
        engine: The fleet database.
        clock: Aware UTC now.
    """

    def __init__(self, engine: Engine, clock: Callable[[], dt.datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def check(self, username: str, address: str) -> None:
        """Raises: TooManyRequests: the backoff after the last failure has not passed."""
        with self._engine.connect() as conn:
            row = conn.execute(select(login_failures).where(
                login_failures.c.username == username[:64],
                login_failures.c.address == address[:_ADDRESS_CHARS])).first()
        if row is None:
            return
        wait = backoff_s(row.failures)
        left = wait - (self._clock() - row.last_failure_at).total_seconds()
        if left > 0:
            raise TooManyRequests(
                f"too many failed logins: retry in {math.ceil(left)} s",
                retry_after_s=math.ceil(left),
            )

    def failed(self, username: str, address: str) -> int:
        """Count one failure; returns the failures so far."""
        key = (login_failures.c.username == username[:64],
               login_failures.c.address == address[:_ADDRESS_CHARS])
        now = self._clock()
        for _ in range(3):  # update, or insert; a concurrent insert makes the update win next
            with self._engine.begin() as conn:
                count = conn.execute(update(login_failures).where(*key).values(
                    failures=login_failures.c.failures + 1, last_failure_at=now,
                ).returning(login_failures.c.failures)).scalar_one_or_none()
                if count is not None:
                    return int(count)
                try:
                    with conn.begin_nested():
                        conn.execute(insert(login_failures).values(
                            username=username[:64], address=address[:_ADDRESS_CHARS],
                            failures=1, last_failure_at=now))
                except IntegrityError:
                    continue
                return 1
        return FREE_ATTEMPTS

    def succeeded(self, username: str, address: str) -> None:
        """Clear the count after a good login."""
        with self._engine.begin() as conn:
            conn.execute(delete(login_failures).where(
                login_failures.c.username == username[:64],
                login_failures.c.address == address[:_ADDRESS_CHARS]))
