"""``edge-fleet keys|model|rollout``: the operator's model-rollout commands.

::

    edge-fleet keys generate --out DIR [--key-id ID] [--role package|rollback]
                                                         writes ID.key (0600) and ID.pub
    edge-fleet model sign PACKAGE_DIR --key FILE         signs manifest.json in place
    edge-fleet model pack PACKAGE_DIR --out FILE         the canonical .tar.gz (to push from
                                                         the web console, docs/console.md)
    edge-fleet model push PACKAGE_DIR                    packs and uploads (admin token)
    edge-fleet model list
    edge-fleet rollout create NAME VERSION (--tag T | --device D ...) [--canary PCT]
                              [--stream S] [--halt-after N]
    edge-fleet rollout list
    edge-fleet rollout show ID                           per-device states
    edge-fleet rollout promote|pause|resume|abort ID [--expect STATE]

``keys``, ``model sign`` and ``model pack`` work offline on files. The others speak HTTP to
``--url`` (default ``$EDGE_FLEET_URL`` or ``http://127.0.0.1:8700``) with the admin token, or a
personal API token (docs/console.md), from ``--admin-token-file`` or
``$EDGE_FLEET_ADMIN_TOKEN``. Exit codes: 0 ok, 1 refused by the fleet
(the reason is printed), 69 fleet unreachable, 78 bad configuration (no token, bad key file).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import requests

from cloud_sync.package import (
    PackageError,
    PackageFormatError,
    generate_keypair,
    pack,
    read_manifest,
)
from cloud_sync.package import sign_package_dir as _sign_dir
from fleet.settings import ADMIN_TOKEN_ENV, DEFAULT_PORT

COMMANDS = ("keys", "model", "rollout")
#: ``keys generate --role``: what a key signs (:func:`key_role`).
KEY_ROLES = ("package", "rollback")
URL_ENV = "EDGE_FLEET_URL"
EX_REFUSED, EX_UNAVAILABLE, EX_CONFIG = 1, 69, 78
_TIMEOUT_S = 60.0


class OperatorError(Exception):
    """A command failed; ``code`` is the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_commands(sub: Any) -> None:
    """Add the ``keys``, ``model`` and ``rollout`` sub-commands to the ``edge-fleet`` parser."""
    http = argparse.ArgumentParser(add_help=False)
    url = os.environ.get(URL_ENV, f"http://127.0.0.1:{DEFAULT_PORT}")
    http.add_argument("--url", default=url,
                      help=f"the fleet's base URL (default ${URL_ENV}, else "
                           f"http://127.0.0.1:{DEFAULT_PORT}; now {url.replace('%', '%%')})")
    http.add_argument("--admin-token-file", type=Path,
                      help=f"file holding the admin or a personal API token (default "
                           f"${ADMIN_TOKEN_ENV})")

    keys = sub.add_parser("keys", help="Ed25519 signing keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    gen = ksub.add_parser("generate", help="new key pair: ID.key (0600) and ID.pub")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--key-id", help="default: first 16 hex of sha256(raw public key)")
    gen.add_argument("--role", choices=KEY_ROLES,
                     help="what the key signs: 'package' (model packages; the default) or "
                          "'rollback' (the fleet's rollbacks on abort: serve --rollback-key); "
                          "default 'rollback' when the key id contains 'rollback'")

    over_http = (f"the fleet at --url (default ${URL_ENV}, else http://127.0.0.1:{DEFAULT_PORT}) "
                 f"with --admin-token-file (default ${ADMIN_TOKEN_ENV})")
    model = sub.add_parser("model", help="sign, push, list model packages",
                           description="Sign and pack work on files; push and list talk to "
                                       f"{over_http}.")
    msub = model.add_subparsers(dest="model_command", required=True)
    sign = msub.add_parser("sign", help="sign PACKAGE_DIR/manifest.json in place")
    sign.add_argument("package_dir", type=Path)
    sign.add_argument("--key", type=Path, required=True, help="private key file (ID.key)")
    pk = msub.add_parser("pack", help="write PACKAGE_DIR as the canonical .tar.gz")
    pk.add_argument("package_dir", type=Path)
    pk.add_argument("--out", type=Path, required=True, help="archive to write (.tar.gz)")
    push = msub.add_parser("push", parents=[http], help="pack and upload a signed package")
    push.add_argument("package_dir", type=Path)
    msub.add_parser("list", parents=[http], help="table of stored packages")

    ro = sub.add_parser("rollout", help="canary, promote, pause, resume, abort rollouts",
                        description=f"Staged model rollouts; every command talks to {over_http}.")
    rsub = ro.add_subparsers(dest="rollout_command", required=True)
    create = rsub.add_parser("create", parents=[http], help="start a rollout")
    create.add_argument("name")
    create.add_argument("version", type=int)
    target = create.add_mutually_exclusive_group(required=True)
    target.add_argument("--tag")
    target.add_argument("--device", action="append", dest="devices")
    create.add_argument("--canary", type=float, help="percent of the target first (min 1)")
    create.add_argument("--stream")
    create.add_argument("--halt-after", type=int, help="failed devices that halt it")
    rsub.add_parser("list", parents=[http], help="table of rollouts")
    for action in ("show", "promote", "pause", "resume", "abort"):
        p = rsub.add_parser(action, parents=[http], help=f"{action} a rollout")
        p.add_argument("rollout_id", type=int)
        if action != "show":
            p.add_argument("--expect", metavar="STATE",
                           help="refuse unless the rollout is in STATE (another operator may "
                                "have acted since you looked)")


def key_role(role: str | None, key_id: str) -> str:
    """The role of a new key: ``role`` when given, else ``"rollback"`` for a key id that
    contains "rollback" (``fleet-rollback``, the name docs/rollouts.md uses), else ``"package"``.

    >>> key_role(None, "fleet-rollback"), key_role(None, "ops"), key_role("rollback", "r1")
    ('rollback', 'package', 'rollback')
    """
    if role is not None:
        return role
    return "rollback" if "rollback" in key_id.lower() else "package"


def key_hint(role: str, priv: Path, pub: Path) -> str:
    """What ``keys generate`` prints: the key id, both files and where each goes for ``role``.

    A package key's ``.pub`` goes to the fleet's ``--trusted-keys`` dir and the agents'
    ``[updater] trusted_keys_dir``; a rollback key's ``.pub`` only to the agents' ``[updater]
    rollback_keys_dir`` (never among the trusted keys: it must not sign packages) and its private
    key to ``edge-fleet serve --rollback-key`` (docs/rollouts.md).
    """
    head = f"key id {priv.stem} ({role} key)\nprivate {priv} (mode 0600: keep it secret)"
    if role == "rollback":
        return (f"{head}; give it to edge-fleet serve --rollback-key {priv}\n"
                f"public  {pub} (copy to the agents' [updater] rollback_keys_dir only; never to "
                "--trusted-keys or the agents' trusted keys: a rollback key signs no package)")
    return (f"{head}\npublic  {pub} (copy to the fleet's --trusted-keys dir and the agents' "
            "[updater] trusted_keys_dir)")


def unsigned_warning(package_dir: Path) -> str:
    """What ``model push`` prints (stderr) before it uploads an unsigned package."""
    return (f"edge-fleet: warning: {package_dir} is not signed: devices that check signatures "
            "(an agent's [updater] trusted_keys_dir) will refuse it, and the fleet stores only "
            f"signed packages; sign it first: edge-fleet model sign {package_dir} --key ID.key")


def run(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    """Run one operator command; returns the exit code (errors go to stderr)."""
    try:
        if args.command == "keys":
            priv, pub = generate_keypair(args.out, args.key_id)
            out(key_hint(key_role(args.role, priv.stem), priv, pub))
        elif args.command == "model" and args.model_command == "sign":
            kid = _sign_dir(args.package_dir, args.key)
            _, m = read_manifest(args.package_dir)
            out(f"signed {m.name}@{m.version} with key {kid}")
        elif args.command == "model" and args.model_command == "pack":
            sha = pack(args.package_dir, args.out)
            out(f"packed {args.out} sha256 {sha}")
        elif args.command == "model":
            _model(args, out)
        else:
            _rollout(args, out)
    except PackageError as exc:
        hint = ""
        if isinstance(exc, PackageFormatError) and args.command == "model":
            hint = (" (PACKAGE_DIR must be a model package directory: manifest.json and the "
                    "artefacts it names, like the shipped models/skab-wstat)")
        print(f"edge-fleet: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
        return EX_CONFIG
    except OperatorError as exc:
        print(f"edge-fleet: {exc}", file=sys.stderr)
        return exc.code
    return 0


def _token(args: argparse.Namespace) -> str:
    token: str
    if args.admin_token_file is not None:
        try:
            token = Path(args.admin_token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise OperatorError(f"cannot read {args.admin_token_file}: {exc}", EX_CONFIG) from None
    else:
        token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if not token:
        raise OperatorError(f"no admin token: --admin-token-file or ${ADMIN_TOKEN_ENV}", EX_CONFIG)
    return token


def _call(args: argparse.Namespace, method: str, path: str, **kw: Any) -> Any:
    headers = {"Authorization": f"Bearer {_token(args)}", **kw.pop("headers", {})}
    url = args.url.rstrip("/") + path
    try:
        resp = requests.request(method, url, headers=headers, timeout=_TIMEOUT_S, **kw)
    except requests.RequestException as exc:
        raise OperatorError(f"fleet unreachable at {args.url}: {exc}", EX_UNAVAILABLE) from None
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail")
        except ValueError:
            detail = resp.text[:500]
        code = EX_UNAVAILABLE if resp.status_code >= 500 else EX_REFUSED
        raise OperatorError(f"HTTP {resp.status_code}: {detail}", code)
    return resp.json() if resp.content else None


def _model(args: argparse.Namespace, out: Callable[[str], None]) -> None:
    if args.model_command == "push":
        _, manifest = read_manifest(args.package_dir)
        if not manifest.signature:
            print(unsigned_warning(args.package_dir), file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="edge-fleet-push-") as tmp:
            archive = Path(tmp) / "package.tar.gz"
            pack(args.package_dir, archive)
            data = archive.read_bytes()
        rec = _call(args, "POST", "/v1/models", data=data,
                    headers={"Content-Type": "application/gzip"})
        out(f"pushed {rec['name']}@{rec['version']} sha256 {rec['archive_sha256']} "
            f"({rec['size']} bytes, key {rec['key_id']})")
        return
    models = _call(args, "GET", "/v1/models")["models"]
    out(table(("NAME", "VERSION", "SIZE", "KEY", "UPLOADED (UTC)", "SHA256", "STORED"), [
        (m["name"], str(m["version"]), str(m["size"]), m["key_id"],
         m["uploaded_at"][:19].replace("T", " "), m["archive_sha256"][:16],
         "CORRUPT: push again" if m.get("corrupt") else "ok")
        for m in models
    ]))


def _rollout(args: argparse.Namespace, out: Callable[[str], None]) -> None:
    cmd = args.rollout_command
    if cmd == "list":
        ros = _call(args, "GET", "/v1/rollouts")["rollouts"]
        out(table(("ID", "MODEL", "STATE", "TARGET", "STREAM", "CANARY%", "DEVICES BY STATE"), [
            (str(r["id"]), f"{r['name']}@{r['version']}", r["state"], _target(r),
             r["stream"] or "*", _pct(r["canary_percent"]),
             " ".join(f"{k}={v}" for k, v in r["counts"].items()))
            for r in ros
        ]))
        return
    if cmd == "create":
        body = {"name": args.name, "version": args.version, "tag": args.tag,
                "devices": args.devices, "stream": args.stream, "canary_percent": args.canary,
                "halt_after_failures": args.halt_after}
        ro = _call(args, "POST", "/v1/rollouts", json={k: v for k, v in body.items()
                                                       if v is not None})
    elif cmd == "show":
        ro = _call(args, "GET", f"/v1/rollouts/{args.rollout_id}")
    else:
        params = {"expected_state": args.expect} if args.expect else None
        ro = _call(args, "POST", f"/v1/rollouts/{args.rollout_id}/{cmd}", params=params)
    out(show(ro))


def show(ro: dict[str, Any]) -> str:
    """A rollout as text: one summary block, then a per-device table."""
    head = [
        f"rollout {ro['id']}: {ro['name']}@{ro['version']}  state {ro['state']}",
        f"target {_target(ro)}  stream {ro['stream'] or '*'}  canary {_pct(ro['canary_percent'])}"
        f"  halt after {ro['halt_after_failures']} failure(s)",
    ]
    if ro.get("reason"):
        head.append(f"reason: {ro['reason']}")
    if ro.get("model_corrupt"):
        head.append(f"CORRUPT PACKAGE: {ro['model_corrupt']}")
    rows = [
        (d["device_id"], "yes" if d["canary"] else "", "yes" if d["assigned"] else "",
         str(d["previous_version"] or "-"),
         (f"{d['state']} @{d['version']}" if d.get("version") is not None else d["state"] or "-"),
         (d["reported_at"] or "-")[:19].replace("T", " "), (d["reason"] or "")[:60])
        for d in ro["devices"]
    ]
    cols = ("DEVICE", "CANARY", "ASSIGNED", "PREV", "STATE", "REPORTED (UTC)", "REASON")
    return "\n".join([*head, "", table(cols, rows)])


def _target(ro: dict[str, Any]) -> str:
    n = len(ro["target_devices"])
    return f"tag {ro['target_tag']} ({n})" if ro["target_tag"] else f"{n} device(s)"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:g}%"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Fixed-width text table: one header line, one line per row."""
    allrows = [tuple(header), *[tuple(r) for r in rows]]
    widths = [max(len(r[i]) for r in allrows) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in allrows
    )
