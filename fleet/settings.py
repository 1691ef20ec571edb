"""Service settings and the admin token.

The admin token comes from, in order: ``--admin-token-file``, the environment variable
``EDGE_FLEET_ADMIN_TOKEN``, or ``<state dir>/admin.token``, which is generated (32 random bytes,
URL-safe base64, mode 0600) at first start. Its path is logged, never the token.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from fleet.errors import ConfigError

ADMIN_TOKEN_ENV = "EDGE_FLEET_ADMIN_TOKEN"  # noqa: S105 (a variable name)
DEFAULT_STATE_DIR = Path("fleet-state")
DEFAULT_PORT = 8700
_SUPPORTED_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg"}

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    """Everything :func:`fleet.app.create_app` needs.

    Attributes:
        db_url: SQLAlchemy URL (``sqlite:///path`` or ``postgresql+psycopg://...``).
        admin_token: The bootstrap admin token (plaintext, compared in constant time); empty
            turns it off (``serve --no-admin-token``: operators use accounts only).
        state_dir: Holds the default SQLite file and the generated admin token.
        pool_size: PostgreSQL connection pool size (per process).
        max_overflow: Extra connections above ``pool_size`` under bursts. Default 0: a burst
            waits for a pooled connection (up to ``pool_timeout_s``) instead of opening
            connections that are closed again at check-in. On PostgreSQL each is a new
            backend process; under saturation 10 overflow connections meant ~230 connects
            per 2,000 requests and 4-17% fewer requests served (``benchmarks/fleet_ingest.py
            --workers 1 --devices 20 --interval 0``).
        pool_timeout_s: Seconds a request waits for a pooled connection before a 503.
        query_limit_max: Largest ``limit`` a query endpoint accepts (rows).
        trusted_keys_dir: Directory of ``<key_id>.pub`` Ed25519 keys a pushed model package
            must be signed by (None: every push is refused).
        signing_key_file: ``<key_id>.key`` the fleet signs retrained packages with (``retrain``,
            ``--auto-retrain``); devices that take those packages trust its public half as a
            package key.
        rollback_key_file: ``<key_id>.key`` the fleet signs rollbacks with on abort (None: an
            abort only stops assigning). Devices trust its public half in
            ``updater.rollback_keys_dir`` only: a separate role, it cannot sign packages.
        rollout_halt_failures: Default number of failed devices that halts a rollout.
        auth_cache_ttl_s: Seconds a worker reuses a successful device-token lookup (0: no
            cache). On SQLite a revoked token keeps working in the other workers for at most
            this long. On PostgreSQL a revocation reaches every worker of every replica when it
            commits (LISTEN/NOTIFY), and entries live at least
            :data:`fleet.db.token_cache.LISTENED_TTL_S` (1 h; :mod:`fleet.db.token_cache`).
        replica_id: This replica's name in ``/metrics`` (``fleet_replica_info``) and its logs;
            empty: ``<host name>``.
        status_retention_days: Model status reports older than this are deleted (checked at
            most hourly per process, :mod:`fleet.db.retention`); 0 keeps them forever.
        session_ttl_s: Lifetime of a console session from its login, seconds (absolute).
        request_timeout_s: A connection that has not sent a whole request (headers and body)
            this long after it opened or began the request is closed (:mod:`fleet.conn_guard`).
        offline_after_s: A device with no health report and no upload for this long is
            ``offline`` (:mod:`fleet.db.health`), seconds.
        retention_s: Age per table name of :data:`fleet.db.retention.RETENTION_TABLES` past
            which rows are deleted, seconds (0: keep); names not given keep their defaults
            (:data:`fleet.db.retention.DEFAULT_RETENTION_S`).
        housekeeping_s: Seconds between two offline sweeps (retention runs hourly).
        webhook_max_attempts: Attempts of one webhook delivery before it is dead.
        webhook_backoff_base_s: Delay after a delivery's first failure (doubles, with jitter).
        webhook_backoff_max_s: Largest delay between two attempts, seconds.
        webhook_timeout_s: Total deadline of one delivery attempt, seconds.
        webhook_poll_s: Seconds between two looks at the delivery queue when idle.
    """

    db_url: str
    admin_token: str
    state_dir: Path = DEFAULT_STATE_DIR
    pool_size: int = 10
    max_overflow: int = 0
    pool_timeout_s: float = 5.0
    query_limit_max: int = 10_000
    trusted_keys_dir: Path | None = None
    signing_key_file: Path | None = None
    rollback_key_file: Path | None = None
    rollout_halt_failures: int = 1
    auth_cache_ttl_s: float = 30.0
    status_retention_days: float = 90.0
    request_timeout_s: float = 10.0
    offline_after_s: float = 300.0
    retention_s: dict[str, float] = field(default_factory=dict)
    housekeeping_s: float = 10.0
    webhook_max_attempts: int = 10
    webhook_backoff_base_s: float = 10.0
    webhook_backoff_max_s: float = 3600.0
    webhook_timeout_s: float = 10.0
    webhook_poll_s: float = 2.0
    session_ttl_s: float = 12 * 3600.0
    replica_id: str = ""


def default_db_url(state_dir: Path) -> str:
    """The default SQLite database inside ``state_dir``."""
    return f"sqlite:///{state_dir / 'fleet.db'}"


def parse_db_url(raw: str) -> URL:
    """Validate a database URL; a bare ``postgresql://`` gets the psycopg 3 driver.

    Raises:
        ConfigError: Unparseable, or neither SQLite nor PostgreSQL.
    """
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"invalid database URL: {exc}") from None
    backend = url.get_backend_name()
    if backend not in _SUPPORTED_DRIVERS:
        raise ConfigError(f"unsupported database {backend!r}: use sqlite or postgresql")
    if backend == "postgresql" and url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    if backend == "postgresql" and url.get_driver_name() != "psycopg":
        raise ConfigError("PostgreSQL URLs must use the psycopg driver (postgresql+psycopg://)")
    if backend == "sqlite" and url.database in (None, "", ":memory:"):
        raise ConfigError("SQLite needs a file path: sqlite:///path/to/fleet.db")
    return url


def resolve_admin_token(
    state_dir: Path, token_file: Path | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """Find the admin token, generating ``<state_dir>/admin.token`` when none is configured.

    Raises:
        ConfigError: The token file is unreadable or empty.
    """
    env = os.environ if environ is None else environ
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read admin token file {token_file}: {exc}") from None
        if not token:
            raise ConfigError(f"admin token file {token_file} is empty")
        return token
    if env.get(ADMIN_TOKEN_ENV, "").strip():
        return env[ADMIN_TOKEN_ENV].strip()
    path = state_dir / "admin.token"
    if path.exists():
        return resolve_admin_token(state_dir, path, env)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
    except FileExistsError:  # another process won the race: use its token
        return resolve_admin_token(state_dir, path, env)
    except OSError as exc:
        raise ConfigError(f"cannot write admin token {path}: {exc}") from None
    _log.warning("generated a new admin token in %s (mode 0600)", path)
    return token
