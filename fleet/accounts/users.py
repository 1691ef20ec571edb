"""Users and their personal API tokens.

Passwords are hashed with argon2id through ``argon2-cffi``'s :class:`argon2.PasswordHasher`
(its defaults: RFC 9106's second recommended profile, t=3, m=64 MiB, p=4; the PHC string
records the parameters, so raising them later rehashes at the next login). A login for an
unknown user still runs one verify against a fixed hash, so the answer time does not tell which
usernames exist.

A personal API token is ``efu_`` + ``secrets.token_urlsafe(32)`` (256 random bits), shown once;
only its sha256 hex is stored (a fast hash is right for a high-entropy random token, as for device
tokens: :mod:`fleet.db.devices`). The prefix lets the bearer check tell a user token from a device
token without a second lookup. A token carries its own role, used as the lesser of it and the
user's current role; a disabled user's tokens stop working at once.
"""

from __future__ import annotations

import builtins
import datetime as dt
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from cloud_sync.protocol import NAME_PATTERN
from fleet.accounts.roles import Role, lowest, parse_role, rank
from fleet.db.account_tables import api_tokens, users
from fleet.db.devices import hash_token, utcnow
from fleet.errors import Conflict, NotFound, Unprocessable

#: Every personal API token starts with this.
TOKEN_PREFIX = "efu_"  # noqa: S105 (a prefix, not a secret)
#: Shortest password accepted (NIST SP 800-63B asks for at least 8; operators get 10).
MIN_PASSWORD_CHARS = 10
MAX_PASSWORD_CHARS = 1024
_NAME = re.compile(NAME_PATTERN)
#: Seconds between two ``last_used_at`` writes of one token.
_LAST_USED_EVERY_S = 60.0


@dataclass(frozen=True)
class User:
    """One account (never the password hash)."""

    username: str
    role: Role
    created_at: dt.datetime
    disabled_at: dt.datetime | None
    has_password: bool


@dataclass(frozen=True)
class TokenInfo:
    """One personal API token (never the token or its hash)."""

    id: int
    username: str
    role: Role
    label: str
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    revoked_at: dt.datetime | None


@dataclass(frozen=True)
class TokenIdentity:
    """Who a valid token acts for, and with which (effective) role."""

    username: str
    role: Role
    token_id: int


def check_username(username: str) -> None:
    """Raises: Unprocessable: not a name (:data:`cloud_sync.protocol.NAME_PATTERN`)."""
    if not _NAME.match(username):
        raise Unprocessable(f"username must match {NAME_PATTERN}")


def check_password(password: str) -> None:
    """Raises: Unprocessable: shorter than :data:`MIN_PASSWORD_CHARS` or absurdly long."""
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        raise Unprocessable(
            f"a password has {MIN_PASSWORD_CHARS}..{MAX_PASSWORD_CHARS} characters"
        )


class UserStore:
    """Users and API tokens in the fleet database.

    Args:
        engine: The fleet database.
        hasher: The argon2 hasher (tests may pass cheaper parameters).
        clock: Aware UTC now.
    """

    def __init__(
        self, engine: Engine, hasher: PasswordHasher | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self._engine = engine
        self._hasher = hasher or PasswordHasher()
        self._clock = clock
        self._dummy_hash: str | None = None  # made at the first login (app start stays cheap)

    # --- users ---------------------------------------------------------------------------------

    def add(self, username: str, role: Role, password: str | None) -> User:
        """Create an account (``password`` None: API tokens only).

        Raises:
            Conflict: The username exists.
            Unprocessable: Bad username, role or password.
        """
        check_username(username)
        parse_role(role)
        if password is not None:
            check_password(password)
        pw_hash = None if password is None else self._hasher.hash(password)
        try:
            with self._engine.begin() as conn:
                conn.execute(insert(users).values(
                    username=username, password_hash=pw_hash, role=role,
                    created_at=self._clock(), disabled_at=None,
                ))
        except IntegrityError:
            raise Conflict(f"user {username!r} exists") from None
        return self._require(username)

    def count_admins(self) -> int:
        """Active admin accounts."""
        with self._engine.connect() as conn:
            rows = conn.execute(select(users.c.username).where(
                users.c.role == "admin", users.c.disabled_at.is_(None))).all()
        return len(rows)

    def get(self, username: str) -> User | None:
        with self._engine.connect() as conn:
            row = conn.execute(select(users).where(users.c.username == username)).first()
        if row is None:
            return None
        return User(username=row.username, role=parse_role(row.role),
                    created_at=row.created_at, disabled_at=row.disabled_at,
                    has_password=row.password_hash is not None)

    def _require(self, username: str) -> User:
        found = self.get(username)
        if found is None:
            raise NotFound(f"no user {username!r}")
        return found

    def list_users(self) -> list[User]:
        """Every account, by name."""
        with self._engine.connect() as conn:
            names = conn.execute(select(users.c.username).order_by(users.c.username)).scalars()
            return [self._require(n) for n in list(names)]

    def update(
        self, username: str, *, role: Role | None = None, password: str | None = None,
        disabled: bool | None = None,
    ) -> User:
        """Change an account's role, password or disabled state.

        Raises:
            NotFound: No such user.
            Unprocessable: Bad role or password.
        """
        values: dict[str, object] = {}
        if role is not None:
            values["role"] = parse_role(role)
        if password is not None:
            check_password(password)
            values["password_hash"] = self._hasher.hash(password)
        if disabled is not None:
            values["disabled_at"] = self._clock() if disabled else None
        with self._engine.begin() as conn:
            done = conn.execute(update(users).where(users.c.username == username)
                                .values(**values)) if values else None
        if done is not None and done.rowcount == 0:
            raise NotFound(f"no user {username!r}")
        return self._require(username)

    def verify_password(self, username: str, password: str) -> User | None:
        """The active user whose password this is, else None (same cost either way).

        A hash made with older argon2 parameters is replaced after a successful check.
        """
        with self._engine.connect() as conn:
            row = conn.execute(select(users.c.password_hash, users.c.disabled_at)
                               .where(users.c.username == username)).first()
        stored = row.password_hash if row is not None and row.password_hash else None
        if stored is None and self._dummy_hash is None:
            self._dummy_hash = self._hasher.hash(secrets.token_urlsafe(16))
        try:
            self._hasher.verify(stored or self._dummy_hash or "", password)
        except (VerificationError, InvalidHashError):
            return None
        if stored is None or row is None or row.disabled_at is not None:
            return None
        if self._hasher.check_needs_rehash(stored):
            with self._engine.begin() as conn:
                conn.execute(update(users).where(users.c.username == username)
                             .values(password_hash=self._hasher.hash(password)))
        return self.get(username)

    # --- API tokens ----------------------------------------------------------------------------

    def create_token(self, username: str, role: Role, label: str = "") -> tuple[int, str]:
        """A new token acting for ``username`` with at most ``role``: ``(id, token)``.

        Raises:
            NotFound: No active user of that name.
            Unprocessable: ``role`` is above the user's role, or a bad label.
        """
        parse_role(role)
        user = self.get(username)
        if user is None or user.disabled_at is not None:
            raise NotFound(f"no active user {username!r}")
        if rank(role) > rank(user.role):
            raise Unprocessable(f"user {username!r} is {user.role}: a token cannot be {role}")
        if len(label) > 64 or not label.isprintable():
            raise Unprocessable("a token label has at most 64 printable characters")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._engine.begin() as conn:
            token_id = conn.execute(insert(api_tokens).values(
                token_hash=hash_token(token), username=username, role=role, label=label,
                created_at=self._clock(), last_used_at=None, revoked_at=None,
            ).returning(api_tokens.c.id)).scalar_one()
        return int(token_id), token

    def authenticate_token(self, token: str) -> TokenIdentity | None:
        """The identity of a valid, unrevoked token of an active user, else None."""
        digest = hash_token(token)
        with self._engine.connect() as conn:
            row = conn.execute(
                select(api_tokens.c.id, api_tokens.c.role, api_tokens.c.username,
                       api_tokens.c.last_used_at, users.c.role.label("user_role"))
                .join(users, users.c.username == api_tokens.c.username)
                .where(api_tokens.c.token_hash == digest, api_tokens.c.revoked_at.is_(None),
                       users.c.disabled_at.is_(None))
            ).first()
        if row is None:
            return None
        now = self._clock()
        if row.last_used_at is None or (now - row.last_used_at).total_seconds() > \
                _LAST_USED_EVERY_S:
            with self._engine.begin() as conn:
                conn.execute(update(api_tokens).where(api_tokens.c.id == row.id)
                             .values(last_used_at=now))
        role = lowest(parse_role(row.role), parse_role(row.user_role))
        return TokenIdentity(username=row.username, role=role, token_id=int(row.id))

    def list_tokens(self, username: str | None = None) -> builtins.list[TokenInfo]:
        """Tokens (revoked ones too), newest first."""
        query = select(api_tokens).order_by(api_tokens.c.id.desc())
        if username is not None:
            query = query.where(api_tokens.c.username == username)
        with self._engine.connect() as conn:
            return [TokenInfo(id=int(r.id), username=r.username, role=parse_role(r.role),
                              label=r.label, created_at=r.created_at,
                              last_used_at=r.last_used_at, revoked_at=r.revoked_at)
                    for r in conn.execute(query)]

    def revoke_token(self, token_id: int) -> str:
        """Revoke a token; returns its user's name. Raises: NotFound: no active token."""
        with self._engine.begin() as conn:
            name = conn.execute(
                update(api_tokens)
                .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
                .values(revoked_at=self._clock()).returning(api_tokens.c.username)
            ).scalar_one_or_none()
        if name is None:
            raise NotFound(f"no active token {token_id}")
        return str(name)
