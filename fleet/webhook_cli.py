"""``edge-fleet webhook ...``: manage webhooks from the command line (database access, like
``edge-fleet device``; over HTTP the same is ``/v1/webhooks`` with the admin token).

::

    edge-fleet webhook add URL --events alert,device_offline,rollout_halted --secret-file F
    edge-fleet webhook list
    edge-fleet webhook remove ID
    edge-fleet webhook deliveries [--state pending|delivered|dead] [--limit 50]
    edge-fleet webhook redeliver DELIVERY_ID

The secret file holds the HMAC key (16..256 characters, surrounding whitespace dropped); the
key is stored in the fleet database (it must sign every delivery) and never printed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sqlalchemy import Engine

from fleet.db.webhooks import EVENTS, WebhookStore
from fleet.errors import ConfigError


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                 common: argparse.ArgumentParser) -> None:
    """Add ``webhook`` and its subcommands to the ``edge-fleet`` parser."""
    hook = sub.add_parser("webhook", help="webhooks: add, list, remove, deliveries, redeliver")
    hook_sub = hook.add_subparsers(dest="webhook_command", required=True)
    add = hook_sub.add_parser("add", parents=[common], help="subscribe a URL to events")
    add.add_argument("url")
    add.add_argument("--events", required=True,
                     help=f"comma-separated, of {','.join(EVENTS)}")
    add.add_argument("--secret-file", type=Path, required=True,
                     help="file holding the HMAC-SHA256 secret (16..256 characters)")
    hook_sub.add_parser("list", parents=[common], help="table of webhooks")
    rm = hook_sub.add_parser("remove", parents=[common], help="delete a webhook")
    rm.add_argument("webhook_id", type=int)
    dl = hook_sub.add_parser("deliveries", parents=[common], help="recent deliveries")
    dl.add_argument("--state", choices=("pending", "delivered", "dead"))
    dl.add_argument("--limit", type=int, default=50)
    re = hook_sub.add_parser("redeliver", parents=[common], help="send a delivery again")
    re.add_argument("delivery_id", type=int)


def _secret(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read secret file {path}: {exc}") from None


def run(args: argparse.Namespace, engine: Engine) -> int:
    """Run one ``webhook`` subcommand on a migrated database; returns the exit code.

    Raises:
        ConfigError: unreadable secret file.
        Unprocessable, NotFound: refused (exit 1 in :func:`fleet.cli.main`).
    """
    store = WebhookStore(engine)
    cmd = args.webhook_command
    if cmd == "add":
        events = [e.strip() for e in args.events.split(",") if e.strip()]
        hook = store.add(args.url, events, _secret(args.secret_file))
        print(f"webhook {hook.id}: {hook.url} ({','.join(hook.events)})")
    elif cmd == "list":
        print("ID  EVENTS  URL")
        for w in store.list():
            print(f"{w.id}  {','.join(w.events)}  {w.url}")
    elif cmd == "remove":
        store.remove(args.webhook_id)
        print(f"removed webhook {args.webhook_id}")
    elif cmd == "deliveries":
        print("ID  WEBHOOK  EVENT  STATE  ATTEMPTS  LAST")
        for d in store.deliveries(args.state, max(1, min(args.limit, 1000))):
            last = d.last_error or (f"HTTP {d.last_status}" if d.last_status else "-")
            print(f"{d.id}  {d.webhook_id}  {d.event}  {d.state}  {d.attempts}  {last}")
    else:
        d = store.redeliver(args.delivery_id)
        print(f"delivery {d.id} queued again")
    return 0
