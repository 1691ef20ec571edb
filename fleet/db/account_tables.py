"""Tables of operator accounts, sessions, personal API tokens, the audit log, login throttling
and alert acknowledgements (SQLAlchemy Core, same metadata as :mod:`fleet.db.schema`);
migration ``0004`` creates exactly these.

* ``users``: one operator account; ``role`` in viewer | operator | admin; ``password_hash`` is
  an argon2id PHC string (``$argon2id$v=19$m=...``), NULL for a token-only account;
  ``disabled_at`` set: no login, no token, no session works.
* ``sessions``: a browser session. ``id_hash`` is the sha256 hex of the random cookie value
  (the value itself is never stored); ``csrf_token`` is the double-submit value the console
  sends back in ``X-CSRF-Token``; ``expires_at`` is absolute.
* ``api_tokens``: a personal API token (CLI, scripts): sha256 hex of the token, the user it acts
  for and its own role (never more than the user's role at the time of use).
* ``audit_log``: every operator action: who (``actor``, ``via``), what (``action``), on what
  (``target``), from where (``address``), when (``at``), and the action's ``detail``.
* ``login_failures``: failed logins per (username, client address) for the backoff.
* ``alert_acks``: an operator acknowledged an alert (one row per alert id).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, ForeignKey, Index, Integer, String, Table, Text

from fleet.db.schema import JsonDoc, UtcDateTime, metadata

_PK = Integer().with_variant(BigInteger, "postgresql")

users = Table(
    "users",
    metadata,
    Column("username", String(64), primary_key=True),
    Column("password_hash", String(256), nullable=True),
    Column("role", String(16), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("disabled_at", UtcDateTime, nullable=True),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id_hash", String(64), primary_key=True),
    Column(
        "username", String(64), ForeignKey("users.username", ondelete="CASCADE"),
        nullable=False, index=True,
    ),
    Column("csrf_token", String(64), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False, index=True),
    Column("address", String(64), nullable=True),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", _PK, primary_key=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column(
        "username", String(64), ForeignKey("users.username", ondelete="CASCADE"),
        nullable=False, index=True,
    ),
    Column("role", String(16), nullable=False),
    Column("label", String(64), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("last_used_at", UtcDateTime, nullable=True),
    Column("revoked_at", UtcDateTime, nullable=True),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", _PK, primary_key=True),
    Column("at", UtcDateTime, nullable=False, index=True),
    Column("actor", String(64), nullable=False),
    Column("via", String(16), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(200), nullable=True),
    Column("address", String(64), nullable=True),
    Column("detail", JsonDoc, nullable=False),
    Index(None, "actor", "at"),
)

login_failures = Table(
    "login_failures",
    metadata,
    Column("username", String(64), primary_key=True),
    Column("address", String(64), primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("last_failure_at", UtcDateTime, nullable=False),
)

alert_acks = Table(
    "alert_acks",
    metadata,
    Column(
        "alert_id", String(160), ForeignKey("alerts.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("acked_by", String(64), nullable=False),
    Column("acked_at", UtcDateTime, nullable=False),
    Column("note", Text, nullable=True),
)
