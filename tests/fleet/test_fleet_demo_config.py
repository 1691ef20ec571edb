"""The fleet quick start's agent config (systemd/fleet-demo.toml) can take a signed rollback.

The commands in its header comment (the README's fleet quick start) are run as written, from a
scratch copy of the checkout's layout: the keys they generate are the ones the config trusts,
the rollback key is a separate trust set (the agent refuses a key in both), and ``serve``'s
``--rollback-key`` is the private half of the key the agent trusts for rollbacks. Without it
``rollout abort`` in the rollout quick start keeps the device on the aborted version.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agent.config.loader import load_config
from agent.services.package_guard import load_keys_dir, load_rollback_policy
from cloud_sync.package import load_private_key, load_public_keys
from fleet.cli import build_parser
from fleet.cli import main as fleet_main

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "systemd" / "fleet-demo.toml"


def _header_commands() -> list[str]:
    """The shell commands of the file's header comment, continuation lines joined."""
    commands: list[str] = []
    for line in DEMO.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        if commands and commands[-1].endswith("\\"):
            commands[-1] = commands[-1][:-1].rstrip() + " " + text
        elif text.startswith(("edge-fleet ", "mkdir ", "edge-agent ")):
            commands.append(text)
    return commands


def _raw(pub: Ed25519PublicKey) -> bytes:
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def test_header_commands_set_up_the_keys_the_config_trusts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "systemd").mkdir()
    shutil.copy(DEMO, tmp_path / "systemd" / DEMO.name)
    monkeypatch.chdir(tmp_path)
    serve = None
    for command in _header_commands():
        argv = shlex.split(command.removesuffix("&").strip())
        if argv[:2] == ["edge-fleet", "keys"]:
            assert fleet_main(argv[1:]) == 0, command
        elif argv[0] == "mkdir":
            subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True, timeout=30)
        elif argv[:2] == ["edge-fleet", "serve"]:
            serve = build_parser().parse_args(argv[1:])
    out = capsys.readouterr().out
    assert "edge-fleet serve --rollback-key fleet-keys/fleet-rollback.key" in out
    assert serve is not None, "no edge-fleet serve line in the header"
    assert serve.rollback_key is not None, "serve has no --rollback-key"

    config = load_config(tmp_path / "systemd" / DEMO.name, env={})
    updater = config.resolved(tmp_path / "systemd").updater
    assert updater.enabled
    assert updater.trusted_keys_dir is not None and updater.rollback_keys_dir is not None
    package_keys = load_keys_dir(updater.trusted_keys_dir, "updater.trusted_keys_dir")
    policy = load_rollback_policy(updater.rollback_keys_dir, updater.rollback_max_age_s,
                                  package_keys)
    assert policy is not None
    rollback_pubs = load_public_keys(Path(updater.rollback_keys_dir))
    signer = load_private_key(tmp_path / serve.rollback_key).public_key()
    assert _raw(signer) in {_raw(k) for k in rollback_pubs.values()}
    assert _raw(signer) not in {_raw(k) for k in package_keys.values()}
    assert Path(updater.trusted_keys_dir).resolve() == (tmp_path / serve.trusted_keys).resolve()
