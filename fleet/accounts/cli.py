"""``edge-fleet user|token``: operator accounts and personal API tokens, on the database.

::

    edge-fleet user add NAME --role viewer|operator|admin [--password-file F | --no-password]
                                  without either, the password is asked twice on the terminal
                                  (no terminal: exit 78, use --password-file)
    edge-fleet user list
    edge-fleet user set NAME [--role R] [--password-file F | --ask-password] [--disable|--enable]
    edge-fleet token create --user NAME --role R [--label L] [--token-file F]
                                  prints the token once (or writes it to a NEW 0600 file)
    edge-fleet token list [--user NAME]
    edge-fleet token revoke ID
    edge-fleet audit list [--action A] [--actor NAME] [--limit 50]
                                  newest first; --action rollout matches every rollout.* action
                                  ("No entries match" when none does)

Like ``edge-fleet device``, these talk to the database (same ``--db``) and need no token: file
system access to the fleet's database is the operator's authority. Each change is recorded in the
audit log as ``cli:<login name>`` via ``cli`` (``audit list`` only reads it).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from fleet.accounts.audit import AuditLog
from fleet.accounts.roles import ROLES, Role, parse_role
from fleet.accounts.sessions import SessionStore
from fleet.accounts.users import UserStore
from fleet.errors import ConfigError
from fleet.secret_files import create_secret_file

COMMANDS = ("user", "token", "audit")


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``user`` and ``token`` to the ``edge-fleet`` parser (``common``: --db, --state-dir)."""
    user = sub.add_parser("user", help="operator accounts (viewer, operator, admin)")
    usub = user.add_subparsers(dest="user_command", required=True)
    add = usub.add_parser("add", parents=[common], help="create an account")
    add.add_argument("username")
    add.add_argument("--role", required=True, choices=ROLES)
    pw = add.add_mutually_exclusive_group()
    pw.add_argument("--password-file", type=Path, metavar="FILE",
                    help="read the password from FILE (a final newline is dropped); without it "
                         "or --no-password, the password is asked twice on the terminal")
    pw.add_argument("--no-password", action="store_true",
                    help="no console login: API tokens only")
    usub.add_parser("list", parents=[common], help="table of accounts")
    set_ = usub.add_parser("set", parents=[common], help="change role, password, disabled")
    set_.add_argument("username")
    set_.add_argument("--role", choices=ROLES)
    pw = set_.add_mutually_exclusive_group()
    pw.add_argument("--password-file", type=Path)
    pw.add_argument("--ask-password", action="store_true", help="ask a new password twice")
    state = set_.add_mutually_exclusive_group()
    state.add_argument("--disable", action="store_true", help="no login, tokens stop working")
    state.add_argument("--enable", action="store_true")

    token = sub.add_parser("token", help="personal API tokens for the CLI and scripts")
    tsub = token.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", parents=[common], help="new token; printed once")
    create.add_argument("--user", required=True)
    create.add_argument("--role", required=True, choices=ROLES,
                        help="the token's role (at most the user's)")
    create.add_argument("--label", default="", help="what the token is for")
    create.add_argument("--token-file", type=Path,
                        help="write the token to this NEW file (mode 0600) instead of stdout")
    lst = tsub.add_parser("list", parents=[common], help="table of tokens")
    lst.add_argument("--user")
    rev = tsub.add_parser("revoke", parents=[common], help="revoke a token by id")
    rev.add_argument("token_id", type=int)

    audit = sub.add_parser("audit", help="the audit log of operator actions")
    asub = audit.add_subparsers(dest="audit_command", required=True)
    alst = asub.add_parser("list", parents=[common], help="entries, newest first")
    alst.add_argument("--action", help="an action (rollout.abort) or a prefix of actions "
                      "(rollout: every rollout.* action)")
    alst.add_argument("--actor", help="a username, bootstrap or cli:<login name>")
    alst.add_argument("--limit", type=int, default=50, help="at most this many (1..1000)")


#: What a missing terminal's error says: where the password goes instead (``user set``) ...
_FILE_HINT = " (the file holds the password; a final newline is dropped)"
#: ... and for ``user add``, an example and the account without a password.
_ADD_HINT = (f"{_FILE_HINT}, e.g. `edge-fleet user add NAME --role admin --password-file FILE`; "
             "or --no-password for an account that uses API tokens only")


def _password(path: Path | None, ask: bool, hint: str = _FILE_HINT) -> str | None:
    if path is not None:
        try:
            return path.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"cannot read password file {path}: {exc}") from None
    if not ask:
        return None
    if not sys.stdin.isatty():
        raise ConfigError(f"no terminal to ask the password: use --password-file FILE{hint}")
    first = getpass.getpass("password: ")
    if first != getpass.getpass("again: "):
        raise ConfigError("the passwords differ")
    return first


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return f"cli:uid{os.getuid()}"


def run(args: argparse.Namespace, engine: Engine, session_ttl_s: float) -> int:
    """Run a ``user`` or ``token`` command on a migrated database; returns the exit code.

    Raises:
        ConfigError: Unreadable password file, no terminal to ask, passwords differ.
        ApiError: Refused (exists, unknown user, role above the user's, bad password).
    """
    users, audit = UserStore(engine), AuditLog(engine)
    actor = _actor()
    if args.command == "audit":
        if not 1 <= args.limit <= 1000:
            raise ConfigError("--limit must be 1..1000")
        entries = audit.list(limit=args.limit, actor=args.actor, action=args.action)
        print(audit_table(entries) if entries else "No entries match")
        return 0
    if args.command == "user":
        if args.user_command == "add":
            role: Role = parse_role(args.role)
            password = _password(args.password_file, not args.no_password, _ADD_HINT)
            users.add(args.username, role, password)
            audit.record(actor, "cli", "user.create", args.username, None, {"role": role})
            print(f"user {args.username} ({role}) created")
        elif args.user_command == "list":
            rows: list[tuple[str, ...]] = [("USER", "ROLE", "LOGIN", "STATE")]
            rows += [
                (u.username, u.role, "password" if u.has_password else "tokens only",
                 "disabled" if u.disabled_at else "active") for u in users.list_users()]
            print(_table(rows))
        else:
            password = _password(args.password_file, args.ask_password)
            disabled = True if args.disable else (False if args.enable else None)
            changed = users.update(args.username, role=args.role, password=password,
                                   disabled=disabled)
            SessionStore(engine, session_ttl_s).delete_user(args.username)
            detail: dict[str, object] = {"role": args.role, "disabled": disabled}
            if password is not None:
                detail["password"] = "changed"  # noqa: S105 (audit text)
            audit.record(actor, "cli", "user.change", args.username, None,
                         {k: v for k, v in detail.items() if v is not None})
            print(f"user {changed.username}: {changed.role}, "
                  f"{'disabled' if changed.disabled_at else 'active'}")
        return 0
    sub_command = args.token_command
    if sub_command == "create":
        token_role = parse_role(args.role)
        if args.token_file is not None:
            with create_secret_file(args.token_file) as fh:
                try:
                    token_id, token = users.create_token(args.user, token_role, args.label)
                except BaseException:
                    args.token_file.unlink(missing_ok=True)
                    raise
                fh.write(token + "\n")
            print(f"token {token_id} for {args.user} ({token_role}) written to "
                  f"{args.token_file} (mode 0600)")
        else:
            token_id, token = users.create_token(args.user, token_role, args.label)
            print(token)
        audit.record(actor, "cli", "token.create", args.user, None,
                     {"id": token_id, "role": token_role, "label": args.label})
    elif sub_command == "list":
        table: list[tuple[str, ...]] = [("ID", "USER", "ROLE", "LABEL", "LAST USED (UTC)",
                                         "STATE")]
        table += [
            (str(t.id), t.username, t.role, t.label or "-",
             t.last_used_at.strftime("%Y-%m-%d %H:%M") if t.last_used_at else "never",
             "revoked" if t.revoked_at else "active") for t in users.list_tokens(args.user)]
        print(_table(table))
    else:
        owner = users.revoke_token(args.token_id)
        audit.record(actor, "cli", "token.revoke", owner, None, {"id": args.token_id})
        print(f"revoked token {args.token_id} of {owner}")
    return 0


def audit_table(entries: list[dict[str, Any]]) -> str:
    """Audit entries (:meth:`~fleet.accounts.audit.AuditLog.list`) as a text table; the detail
    as ``key=value`` pairs."""
    rows: list[tuple[str, ...]] = [("ID", "AT (UTC)", "ACTOR", "VIA", "ACTION", "TARGET",
                                    "DETAIL")]
    rows += [
        (str(e["id"]), e["at"].strftime("%Y-%m-%d %H:%M:%S"), e["actor"], e["via"], e["action"],
         e["target"] or "-",
         " ".join(f"{k}={_detail_value(v)}" for k, v in _ordered(e["detail"] or {})) or "-")
        for e in entries]
    return _table(rows)


#: Detail keys shown first (in this order), and last; the others sorted between them (the
#: database may hand them back in any order: PostgreSQL's JSONB sorts them its own way).
_FIRST, _LAST = ("rollout", "model", "stream", "tag", "devices", "device_count", "state"), "reason"


def _ordered(detail: dict[str, Any]) -> list[tuple[str, Any]]:
    def rank(key: str) -> tuple[int, int, str]:
        if key in _FIRST:
            return 0, _FIRST.index(key), key
        return (2 if key == _LAST else 1), 0, key
    return [(k, detail[k]) for k in sorted(detail, key=rank)]


def _detail_value(value: object) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() for c in text) else text


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)
