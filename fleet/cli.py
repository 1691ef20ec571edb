"""``edge-fleet``: serve the API, migrate the database, manage devices.

::

    edge-fleet serve [--db URL] [--host 127.0.0.1] [--port 8700] [--admin-token-file F]
                     [--tls-cert PEM --tls-key PEM] [--request-timeout 10]
                     [--status-retention-days 90]
                     [--state-dir fleet-state] [--pool-size 10] [--workers 1]
                     [--trusted-keys DIR] [--signing-key FILE] [--rollback-key FILE]
                     [--halt-after N] [--offline-after 300] [--retention alerts=365d,...]
                     [--webhook-max-attempts 10] [--webhook-backoff 10] [--webhook-timeout 10]
                     [--no-admin-token] [--session-hours 12]
                     [--auth-cache-ttl 30] [--auto-retrain] [--base-model DIR]
                     [--replica-id NAME]
                     (EDGE_FLEET_DB may replace --db)
    edge-fleet retrain --device D --stream S --signing-key F --trusted-keys DIR
                                               (see fleet/training/cli.py)
    edge-fleet worker --signing-key F --trusted-keys DIR [--lease 30] [--once]
    edge-fleet jobs list|enqueue               retraining jobs (see fleet/jobs/cli.py)
    edge-fleet db upgrade [--db URL] [--create-db]
    edge-fleet device add ID [--tag T ...] [--token-file F] [--create-db]
                                               prints the new token (shown once), or writes
                                               it to a NEW file F (mode 0600)
    edge-fleet device list [--all] [--offline-after SECONDS]
                                               ENROLMENT enrolled/pending/revoked, CONNECTION
                                               online/offline/never (fleet/device_listing.py)
    edge-fleet device revoke ID
    edge-fleet device tag ID [--add T ...] [--remove T ...]   change an enrolled device's tags
    edge-fleet keys|model|rollout ...          model rollout (see fleet/operator_cli.py)
    edge-fleet webhook add|list|remove|deliveries|redeliver   (see fleet/webhook_cli.py)
    edge-fleet user|token|audit ...            operator accounts, API tokens, the audit log
                                               (see fleet/accounts/cli.py)

The ``device`` commands talk to the database directly (same ``--db``), not over HTTP: they work
before the server is up and need no admin token, which is the operator's file-system access.
``serve`` creates and migrates the database before it listens; the other database commands
refuse a database that does not exist, is an empty file or holds no fleet schema (exit 78: a typo
in ``--db`` or ``--state-dir`` would otherwise start a second, empty fleet) unless given
``--create-db`` (:mod:`fleet.db.existing`). Without ``--db`` the database is
``sqlite:///<state dir>/fleet.db`` (WAL). Exit codes: 0 ok, 1 refused (unknown or already
enrolled device), 69 database unreachable (EX_UNAVAILABLE; also the console script without
the fleet extra, :mod:`fleet.entry`), 70 migration failed
(EX_SOFTWARE), 78 bad configuration or no database (EX_CONFIG), 141 the reader of stdout closed
it (``| head``).

What these commands write (database, state directory, token files) is owner-only (umask 077,
:mod:`fleet.secret_files`). ``serve --workers N`` hands its worker processes the admin token as
a file path (a 0600 file), never in their environment.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from fleet import gc_tuning
from fleet.db.devices import DeviceRegistry, utcnow
from fleet.db.engine import make_engine
from fleet.device_listing import format_table
from fleet.errors import ApiError, ConfigError, MigrationError, StorageUnavailable
from fleet.secret_files import (
    create_secret_file,
    private_copy,
    private_umask,
    remove_private_copy,
)
from fleet.settings import (
    ADMIN_TOKEN_ENV,
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    Settings,
    default_db_url,
    resolve_admin_token,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

EX_REFUSED, EX_UNAVAILABLE, EX_SOFTWARE, EX_CONFIG = 1, 69, 70, 78
#: Exit code when stdout's reader closed it early, as a shell reports a process killed by SIGPIPE.
EX_PIPE = 128 + 13
_ENV_DB, _ENV_POOL, _ENV_STATE = "EDGE_FLEET_DB", "EDGE_FLEET_POOL_SIZE", "EDGE_FLEET_STATE_DIR"
_ENV_KEYS, _ENV_SIGNING = "EDGE_FLEET_TRUSTED_KEYS", "EDGE_FLEET_SIGNING_KEY"
_ENV_ROLLBACK = "EDGE_FLEET_ROLLBACK_KEY"
_ENV_HALT = "EDGE_FLEET_HALT_AFTER"
_ENV_AUTH_TTL = "EDGE_FLEET_AUTH_CACHE_TTL"
_ENV_TOKEN_FILE, _ENV_RETENTION = "EDGE_FLEET_ADMIN_TOKEN_FILE", "EDGE_FLEET_STATUS_RETENTION_DAYS"
_ENV_REQUEST_TIMEOUT = "EDGE_FLEET_REQUEST_TIMEOUT"
_ENV_MAX_CONNS = "EDGE_FLEET_MAX_CONNS_PER_CLIENT"
_ENV_OPS, _ENV_PROM = "EDGE_FLEET_OPS_SETTINGS", "PROMETHEUS_MULTIPROC_DIR"
_ENV_NO_ADMIN, _ENV_SESSION = "EDGE_FLEET_NO_ADMIN_TOKEN", "EDGE_FLEET_SESSION_S"
_ENV_REPLICA = "EDGE_FLEET_REPLICA_ID"
_ENV_AUTO_RETRAIN = "EDGE_FLEET_AUTO_RETRAIN"
#: Commands that write the database, the state directory or a token.
_PRIVATE_COMMANDS = ("serve", "db", "device", "retrain", "worker", "jobs", "webhook", "user",
                     "token", "audit")
#: Seconds uvicorn's supervisor waits for a worker's health answer (``--workers N``) before it
#: kills and respawns the worker; uvicorn's default is 5. A worker answers only once it has
#: imported the app (1.5-2.5 s of CPU here), so on a busy 2-core host a new worker missed 5 s,
#: was killed and respawned over and over (15 times in one 300,000-row backlog drain, each costing
#: its imports) and the fleet served from one worker. A hung worker is still replaced.
WORKER_HEALTHCHECK_S = 60
_log = logging.getLogger("fleet")


def build_parser() -> argparse.ArgumentParser:
    from fleet import operator_cli, webhook_cli  # noqa: PLC0415 (not in the worker processes)
    from fleet.accounts import cli as accounts_cli  # noqa: PLC0415 (idem)
    from fleet.jobs import cli as jobs_cli  # noqa: PLC0415 (idem)
    from fleet.training import cli as training_cli  # noqa: PLC0415 (idem)

    parser = argparse.ArgumentParser(
        prog="edge-fleet", description=__doc__.splitlines()[0],
        epilog=f"model push|list and rollout talk HTTP to the fleet at --url, default "
        f"${operator_cli.URL_ENV} (else http://127.0.0.1:{DEFAULT_PORT}), with the token of "
        f"${ADMIN_TOKEN_ENV} or --admin-token-file. serve, device, user, token, webhook, jobs "
        f"and db work on the database in --state-dir (default ./{DEFAULT_STATE_DIR}) or --db.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", help="SQLAlchemy URL (default sqlite:///<state dir>/fleet.db)")
    common.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    # the commands other than serve: a missing or empty database is refused (fleet.db.existing)
    dbcommon = argparse.ArgumentParser(add_help=False, parents=[common])
    dbcommon.add_argument("--create-db", action="store_true",
                          help="create and migrate the database when it does not exist yet "
                               "(without it, a missing or empty database is refused: exit 78)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", parents=[common], help="run the HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--admin-token-file", type=Path)
    serve.add_argument("--pool-size", type=int, default=10, help="DB connections per process")
    serve.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--trusted-keys", type=Path,
                       help="dir of ID.pub keys; pushed packages must be signed by one")
    serve.add_argument("--signing-key", type=Path,
                       help="ID.key the fleet signs retrained packages with (edge-fleet "
                            "worker; serve itself does not need it)")
    serve.add_argument("--rollback-key", type=Path,
                       help="ID.key the fleet signs rollbacks with when a rollout is aborted "
                            "(devices trust it in updater.rollback_keys_dir; never a package "
                            "key)")
    serve.add_argument("--halt-after", type=int, default=1,
                       help="failed devices that halt a rollout (default 1)")
    serve.add_argument("--auth-cache-ttl", type=float, default=Settings.auth_cache_ttl_s,
                       metavar="S",
                       help="seconds a worker reuses a device-token lookup on SQLite, where "
                            "a revoked token works in other workers for at most this long (on "
                            "PostgreSQL every replica drops it at once and entries live at "
                            "least 3600 s; 0: off on both; default 30)")
    serve.add_argument("--replica-id", default="", metavar="NAME",
                       help="this replica's name in /metrics (fleet_replica_info; default "
                            "<host name>:<port>)")
    serve.add_argument("--tls-cert", type=Path, metavar="PEM",
                       help="serve HTTPS with this certificate chain (needs --tls-key)")
    serve.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")
    serve.add_argument("--request-timeout", type=float, default=Settings.request_timeout_s,
                       metavar="S", help="close a connection that has not sent its request "
                       "headers within S seconds (the body gets S + 1 s per 32 KiB; default 10)")
    serve.add_argument("--max-conns-per-client", type=int, default=0, metavar="N",
                       help="answer 503 to a client address that already holds N open "
                       "connections (per worker; 0: no limit, the default; behind a proxy or "
                       "NAT many devices share an address: limit in the proxy instead)")
    serve.add_argument("--status-retention-days", type=float,
                       default=Settings.status_retention_days, metavar="D",
                       help="delete model status reports older than D days (0: keep; default 90)")
    serve.add_argument("--offline-after", type=float, default=Settings.offline_after_s,
                       metavar="S", help="a device silent this long (no health report, no "
                       "upload) is offline (default 300)")
    serve.add_argument("--retention", default="", metavar="NAME=AGE,...",
                       help="delete rows older than AGE per table: alerts, aggregates, "
                       "samples, status_reports, health, audit, webhook_deliveries; AGE like "
                       "365d, 12h, keep (e.g. alerts=365d,aggregates=90d)")
    serve.add_argument("--webhook-max-attempts", type=int,
                       default=Settings.webhook_max_attempts, metavar="N",
                       help="attempts of one webhook delivery before it is dead (default 10)")
    serve.add_argument("--webhook-backoff", type=float, default=Settings.webhook_backoff_base_s,
                       metavar="S", help="delay after a delivery's first failure; doubles "
                       "(with jitter) up to 1 h (default 10)")
    serve.add_argument("--webhook-timeout", type=float, default=Settings.webhook_timeout_s,
                       metavar="S", help="total deadline of one delivery attempt (default 10)")
    serve.add_argument("--no-admin-token", action="store_true",
                       help="refuse the bootstrap admin token: operators use accounts and "
                            "personal API tokens only (docs/console.md)")
    serve.add_argument("--session-hours", type=float, default=Settings.session_ttl_s / 3600,
                       metavar="H", help="console session lifetime from login (default 12)")
    training_cli.add_arguments(serve, serve=True)

    retrain = sub.add_parser("retrain", parents=[dbcommon],
                             help="retrain a device stream's model from its samples and publish")
    retrain.add_argument("--signing-key", type=Path, help="the fleet's ID.key (signs the package)")
    retrain.add_argument("--trusted-keys", type=Path, help="dir of ID.pub keys (registry check)")
    training_cli.add_arguments(retrain, serve=False)

    db = sub.add_parser("db", help="schema migrations")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", parents=[dbcommon], help="migrate to the newest schema")

    device = sub.add_parser("device", help="enroll, list, tag, revoke devices")
    dev_sub = device.add_subparsers(dest="device_command", required=True)
    add = dev_sub.add_parser("add", parents=[dbcommon], help="enroll; prints the token once")
    add.add_argument("device_id")
    add.add_argument("--tag", action="append", default=[], dest="tags")
    add.add_argument("--token-file", type=Path,
                     help="write the token to this NEW file (mode 0600) instead of stdout")
    lst = dev_sub.add_parser("list", parents=[dbcommon], help="table of devices")
    lst.add_argument("--all", action="store_true", help="include revoked devices")
    lst.add_argument("--offline-after", type=float, default=Settings.offline_after_s,
                     metavar="SECONDS", help="CONNECTION is offline after this long without "
                     "contact (default 300, as edge-fleet serve --offline-after)")
    rev = dev_sub.add_parser("revoke", parents=[dbcommon], help="invalidate a device token")
    rev.add_argument("device_id")
    tag = dev_sub.add_parser("tag", parents=[dbcommon],
                             help="add or remove an enrolled device's tags (the token stays)")
    tag.add_argument("device_id")
    tag.add_argument("--add", action="append", default=[], metavar="TAG",
                     help="add a tag (k=v replaces the device's other k=... tag)")
    tag.add_argument("--remove", action="append", default=[], metavar="TAG",
                     help="remove a tag (a bare key k also removes k=...)")
    operator_cli.add_commands(sub)
    webhook_cli.add_commands(sub, dbcommon)
    accounts_cli.add_commands(sub, dbcommon)
    jobs_cli.add_commands(sub, dbcommon)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``edge-fleet`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "info").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # alembic 1.16+ logs one INFO line per autogenerate plugin when it is first imported (7
    # lines before each `edge-fleet device add`): nothing an operator acts on
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    if args.command in _PRIVATE_COMMANDS:
        private_umask()
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"edge-fleet: configuration error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except StorageUnavailable as exc:
        print(f"edge-fleet: database unavailable: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    except MigrationError as exc:
        print(f"edge-fleet: {exc}", file=sys.stderr)
        return EX_SOFTWARE
    except ApiError as exc:
        print(f"edge-fleet: {exc.detail}", file=sys.stderr)
        return EX_REFUSED
    except BrokenPipeError:
        # the reader went away (`edge-fleet rollout show 1 | head`): no traceback, and none
        # from the interpreter's last flush of stdout either
        with contextlib.suppress(OSError, ValueError):  # stdout may have no descriptor
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EX_PIPE


def _run(args: argparse.Namespace) -> int:
    from fleet import operator_cli  # noqa: PLC0415 (see build_parser)
    from fleet.accounts import cli as accounts_cli  # noqa: PLC0415 (idem)
    from fleet.db import existing, migrate  # noqa: PLC0415 (alembic: not in the workers)
    from fleet.jobs import cli as jobs_cli  # noqa: PLC0415
    from fleet.training import cli as training_cli  # noqa: PLC0415

    if args.command == "serve":
        return _serve(args)
    if args.command in operator_cli.COMMANDS:
        return operator_cli.run(args)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    settings = _settings(args)
    existing.check_path(settings.db_url, create=args.create_db)
    engine = make_engine(settings)
    try:
        existing.check_schema(engine, create=args.create_db)
        migrate.upgrade(engine)
        if args.command == "db":
            print(f"database at revision {migrate.current_revision(engine)}")
            return 0
        if args.command == "retrain":
            return training_cli.run_retrain(args, _settings(args), engine)
        if args.command in jobs_cli.COMMANDS:
            return jobs_cli.run(args, _settings(args), engine)
        if args.command == "webhook":
            from fleet import webhook_cli  # noqa: PLC0415

            return webhook_cli.run(args, engine)
        if args.command in accounts_cli.COMMANDS:
            return accounts_cli.run(args, engine, _settings(args).session_ttl_s)
        registry = DeviceRegistry(engine)
        if args.device_command == "add":
            from cloud_sync.protocol import EnrollRequest  # noqa: PLC0415 (validation only)

            try:
                EnrollRequest(device_id=args.device_id, tags=args.tags)
            except ValueError as exc:
                raise ConfigError(f"invalid device id or tags: {exc}") from None
            _enroll(registry, args)
        elif args.device_command == "list":
            if not 0 < args.offline_after <= 30 * 86400:  # as serve --offline-after
                raise ConfigError("--offline-after must be 0..2592000 s")
            print(format_table(registry.list(include_revoked=args.all), utcnow(),
                               args.offline_after))
        elif args.device_command == "tag":
            if not args.add and not args.remove:
                raise ConfigError("device tag: give --add TAG and/or --remove TAG")
            changed = registry.set_tags(args.device_id, args.add, args.remove)
            print(f"{changed.device_id}: tags {' '.join(changed.tags) or '(none)'}")
        else:
            registry.revoke(args.device_id)
            print(f"revoked {args.device_id}")
        return 0
    finally:
        engine.dispose()


def _settings(args: argparse.Namespace, admin_token: str = "") -> Settings:
    state_dir: Path = args.state_dir
    return Settings(
        db_url=args.db or os.environ.get(_ENV_DB) or default_db_url(state_dir),
        admin_token=admin_token,
        state_dir=state_dir,
        pool_size=getattr(args, "pool_size", 10),
        trusted_keys_dir=getattr(args, "trusted_keys", None),
        signing_key_file=getattr(args, "signing_key", None),
        rollback_key_file=getattr(args, "rollback_key", None),
        rollout_halt_failures=getattr(args, "halt_after", 1),
        auth_cache_ttl_s=getattr(args, "auth_cache_ttl", Settings.auth_cache_ttl_s),
        status_retention_days=getattr(
            args, "status_retention_days", Settings.status_retention_days
        ),
        request_timeout_s=getattr(args, "request_timeout", Settings.request_timeout_s),
        offline_after_s=getattr(args, "offline_after", Settings.offline_after_s),
        retention_s=_retention(getattr(args, "retention", "")),
        webhook_max_attempts=getattr(args, "webhook_max_attempts",
                                     Settings.webhook_max_attempts),
        webhook_backoff_base_s=getattr(args, "webhook_backoff", Settings.webhook_backoff_base_s),
        webhook_timeout_s=getattr(args, "webhook_timeout", Settings.webhook_timeout_s),
        session_ttl_s=getattr(args, "session_hours", Settings.session_ttl_s / 3600) * 3600,
        replica_id=_replica_id(args),
    )


def _replica_id(args: argparse.Namespace) -> str:
    """``--replica-id``, else ``<host name>:<port>`` for ``serve`` (empty for other commands)."""
    if getattr(args, "replica_id", ""):
        return str(args.replica_id)
    port = getattr(args, "port", None)
    return f"{socket.gethostname()}:{port}" if port is not None else ""


def _retention(spec: str) -> dict[str, float]:
    """Raises: ConfigError: a bad ``--retention`` (:func:`fleet.db.retention.parse_retention`)."""
    from fleet.db.retention import parse_retention  # noqa: PLC0415

    try:
        return parse_retention(spec)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _enroll(registry: DeviceRegistry, args: argparse.Namespace) -> None:
    """Enroll; print the token, or write it to ``--token-file`` (created first: 0600, new)."""
    if args.token_file is None:
        print(registry.enroll(args.device_id, args.tags))
        return
    path: Path = args.token_file
    with create_secret_file(path) as fh:
        try:
            token = registry.enroll(args.device_id, args.tags)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        fh.write(token + "\n")
    print(f"enrolled {args.device_id}: token written to {path} (mode 0600)")


def _serve(args: argparse.Namespace) -> int:
    import uvicorn  # noqa: PLC0415 (only serve needs it)

    from fleet import conn_guard  # noqa: PLC0415 (imports uvicorn)
    from fleet.app import create_app  # noqa: PLC0415
    from fleet.db import migrate  # noqa: PLC0415

    if not 0 < args.port < 65536:
        raise ConfigError(f"port {args.port} out of range")
    if not 1 <= args.workers <= 64 or args.pool_size < 1:
        raise ConfigError("--workers must be 1..64 and --pool-size at least 1")
    if not 0 <= args.auth_cache_ttl <= 3600:
        raise ConfigError("--auth-cache-ttl must be 0..3600 seconds")
    if args.max_conns_per_client < 0:
        raise ConfigError("--max-conns-per-client must be 0 (no limit) or more")
    if not 0 < args.request_timeout <= 3600 or not 0 <= args.status_retention_days <= 36500:
        raise ConfigError("--request-timeout must be 0..3600 s, --status-retention-days 0..36500")
    if not 0 < args.offline_after <= 30 * 86400 or not 1 <= args.webhook_max_attempts <= 100:
        raise ConfigError("--offline-after must be 0..2592000 s, --webhook-max-attempts 1..100")
    if not 0 < args.webhook_backoff <= 86400 or not 0 < args.webhook_timeout <= 300:
        raise ConfigError("--webhook-backoff must be 0..86400 s, --webhook-timeout 0..300 s")
    from_env = args.admin_token_file is None and bool(os.environ.get(ADMIN_TOKEN_ENV, "").strip())
    if not 0 < args.session_hours <= 24 * 90:
        raise ConfigError("--session-hours must be 0..2160")
    if args.no_admin_token:
        token = ""
        _log.info("bootstrap admin token off (--no-admin-token): accounts and API tokens only")
    else:
        generated = (args.admin_token_file is None and not from_env
                     and not (args.state_dir / "admin.token").exists())
        token = resolve_admin_token(args.state_dir, args.admin_token_file)
        if generated and (args.db or os.environ.get(_ENV_DB) or "").startswith("postgresql"):
            _log.warning("generated an admin token in this replica's state directory: other "
                         "replicas of this PostgreSQL fleet have their own; give every replica "
                         "the same --admin-token-file or use accounts (--no-admin-token)")
    os.environ.pop(ADMIN_TOKEN_ENV, None)  # no child process inherits it (module docstring)
    _check_port_free(args.host, args.port)
    settings = _settings(args, token)
    options = _server_options(args)
    engine = make_engine(settings)
    migrate.upgrade(engine)
    scheme = "https" if "ssl_certfile" in options else "http"
    _log.info("edge-fleet on %s://%s:%d (console: %s://%s:%d/console/), database %s, "
              "%d worker(s)", scheme, args.host, args.port, scheme, args.host, args.port,
              engine.url.render_as_string(hide_password=True), args.workers)
    conn_guard.configure(settings.request_timeout_s, args.max_conns_per_client)
    if scheme == "http" and not _loopback(args.host):
        _log.warning("serving plain HTTP on %s: tokens cross the network in clear; use "
                     "--tls-cert/--tls-key or a TLS proxy", args.host)
    if args.auto_retrain:
        _log.info("auto-retrain: calibration samples enqueue retraining jobs; edge-fleet worker "
                  "processes run them")
    if args.workers <= 1:
        app = create_app(settings, engine, _enqueue_hook(engine) if args.auto_retrain else None)
        gc_tuning.settle()  # fleet.gc_tuning
        uvicorn.run(app, **options)
        engine.dispose()
        return 0
    # Worker processes import the app by name: hand them the resolved settings by environment,
    # and the admin token as a file path (a private copy when it came in the environment).
    engine.dispose()
    copy = private_copy(token, "admin.token") if from_env and token else None
    token_file = copy or args.admin_token_file or args.state_dir / "admin.token"
    os.environ.update({
        _ENV_DB: settings.db_url,
        _ENV_TOKEN_FILE: str(Path(token_file).absolute()),
        _ENV_RETENTION: str(settings.status_retention_days),
        _ENV_REQUEST_TIMEOUT: str(settings.request_timeout_s),
        _ENV_MAX_CONNS: str(args.max_conns_per_client),
        _ENV_POOL: str(settings.pool_size),
        _ENV_STATE: str(settings.state_dir),
        _ENV_KEYS: str(settings.trusted_keys_dir or ""),
        _ENV_SIGNING: str(settings.signing_key_file or ""),
        _ENV_ROLLBACK: str(settings.rollback_key_file or ""),
        _ENV_HALT: str(settings.rollout_halt_failures),
        _ENV_AUTH_TTL: str(settings.auth_cache_ttl_s),
        _ENV_OPS: json.dumps(_ops_settings(settings)),
        # every worker counts into its own files here; /metrics sums them (fleet.metrics)
        _ENV_PROM: tempfile.mkdtemp(prefix="edge-fleet-metrics-"),
        _ENV_NO_ADMIN: "1" if not token else "",
        _ENV_SESSION: str(settings.session_ttl_s),
        _ENV_REPLICA: settings.replica_id,
        _ENV_AUTO_RETRAIN: "1" if args.auto_retrain else "",
    })
    try:
        uvicorn.run("fleet.cli:worker_app", factory=True, workers=args.workers,
                    timeout_worker_healthcheck=WORKER_HEALTHCHECK_S, **options)
    finally:
        if copy is not None:
            remove_private_copy(copy)
        shutil.rmtree(os.environ.pop(_ENV_PROM), ignore_errors=True)
    return 0


#: Settings of fleet operations handed to worker processes as one JSON document.
_OPS_FIELDS = ("offline_after_s", "retention_s", "webhook_max_attempts",
               "webhook_backoff_base_s", "webhook_timeout_s")


def _ops_settings(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in _OPS_FIELDS}


def _check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` as uvicorn will (``SO_REUSEADDR``) and let it go again.

    Raises:
        ConfigError: the port is taken (another edge-fleet?) or the address is not this host's;
            uvicorn would log that after the start-up line and exit 3.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host!r}: {exc.strerror}") from None
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another "
                              "edge-fleet, or another program: stop it or give --port)") from None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn options: address, the slow-client guard (:mod:`fleet.conn_guard`), TLS.

    Raises:
        ConfigError: only one of ``--tls-cert``/``--tls-key``, or one is unreadable.
    """
    from fleet import conn_guard  # noqa: PLC0415 (imports uvicorn)

    options: dict[str, Any] = {"host": args.host, "port": args.port, "log_level": args.log_level,
                               "access_log": False, "server_header": False,
                               "http": conn_guard.HTTP_PROTOCOL}
    cert, key = args.tls_cert, args.tls_key
    if (cert is None) != (key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if cert is not None and key is not None:
        for path in (cert, key):
            if not os.access(path, os.R_OK):
                raise ConfigError(f"cannot read {path}")
        # the asyncio loop: its TLS layer takes conn_guard's handshake bound (uvloop's does not)
        options.update(ssl_certfile=str(cert), ssl_keyfile=str(key), loop="asyncio")
    return options


def worker_app() -> FastAPI:
    """App factory for ``--workers N`` (settings from the environment ``serve`` prepared)."""
    from fleet import conn_guard  # noqa: PLC0415
    from fleet.app import create_app  # noqa: PLC0415

    state_dir = Path(os.environ[_ENV_STATE])
    timeout = float(os.environ.get(_ENV_REQUEST_TIMEOUT, str(Settings.request_timeout_s)))
    conn_guard.configure(timeout, int(os.environ.get(_ENV_MAX_CONNS, "0")))
    no_admin = bool(os.environ.get(_ENV_NO_ADMIN))
    settings = Settings(
        db_url=os.environ[_ENV_DB],
        admin_token="" if no_admin else resolve_admin_token(
            state_dir, Path(os.environ[_ENV_TOKEN_FILE])),
        session_ttl_s=float(os.environ.get(_ENV_SESSION, str(Settings.session_ttl_s))),
        replica_id=os.environ.get(_ENV_REPLICA, ""),
        request_timeout_s=timeout,
        status_retention_days=float(
            os.environ.get(_ENV_RETENTION, str(Settings.status_retention_days))
        ),
        state_dir=state_dir,
        pool_size=int(os.environ[_ENV_POOL]),
        trusted_keys_dir=Path(os.environ[_ENV_KEYS]) if os.environ.get(_ENV_KEYS) else None,
        signing_key_file=(
            Path(os.environ[_ENV_SIGNING]) if os.environ.get(_ENV_SIGNING) else None
        ),
        rollback_key_file=(
            Path(os.environ[_ENV_ROLLBACK]) if os.environ.get(_ENV_ROLLBACK) else None
        ),
        rollout_halt_failures=int(os.environ.get(_ENV_HALT, "1")),
        auth_cache_ttl_s=float(
            os.environ.get(_ENV_AUTH_TTL, str(Settings.auth_cache_ttl_s))
        ),
        **{k: v for k, v in json.loads(os.environ.get(_ENV_OPS, "{}")).items()
           if k in _OPS_FIELDS},
    )
    engine = make_engine(settings)
    hook = _enqueue_hook(engine) if os.environ.get(_ENV_AUTO_RETRAIN) else None
    app = create_app(settings, engine, hook)
    gc_tuning.settle()  # freeze what lives as long as the process; rare full collections
    return app


def _enqueue_hook(engine: Engine) -> Callable[[str, str], object]:
    """``serve --auto-retrain``: a calibration upload enqueues a retraining job (coalesced with
    a pending one of that stream); ``edge-fleet worker`` processes run it."""
    from fleet.jobs.queue import JobQueue  # noqa: PLC0415

    queue = JobQueue(engine)
    return lambda device_id, stream: queue.enqueue(device_id, stream, "auto")


if __name__ == "__main__":
    raise SystemExit(main())
