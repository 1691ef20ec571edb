"""The account services of a running app and their request dependency.

Kept apart from :class:`fleet.api.deps.Services` (as the model loop is): :func:`fleet.app.
create_app` stores an :class:`Accounts` in ``app.state.accounts``.
"""

from __future__ import annotations

from dataclasses import dataclass

from argon2 import PasswordHasher
from sqlalchemy import Engine
from starlette.requests import Request

from fleet.accounts.audit import AuditLog
from fleet.accounts.sessions import LoginThrottle, SessionStore
from fleet.accounts.users import UserStore

#: Cookie names of the console (``__Host-`` prefixed over TLS: RFC 6265bis §4.1.3.2).
SESSION_COOKIE = "edge_fleet_session"
CSRF_COOKIE = "edge_fleet_csrf"
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True)
class Accounts:
    """Users, sessions, login throttle and audit log of one app."""

    users: UserStore
    sessions: SessionStore
    throttle: LoginThrottle
    audit: AuditLog


def build_accounts(
    engine: Engine, session_ttl_s: float, hasher: PasswordHasher | None = None
) -> Accounts:
    """Wire the account services on ``engine``."""
    return Accounts(
        users=UserStore(engine, hasher),
        sessions=SessionStore(engine, session_ttl_s),
        throttle=LoginThrottle(engine),
        audit=AuditLog(engine),
    )


def get_accounts(request: Request) -> Accounts:
    accounts = request.app.state.accounts
    assert isinstance(accounts, Accounts)
    return accounts


def cookie_name(base: str, secure: bool) -> str:
    """``__Host-<base>`` over TLS (bound to the host, Secure, path /), else ``base``."""
    return f"__Host-{base}" if secure else base
