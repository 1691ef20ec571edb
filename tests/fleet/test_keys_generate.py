"""``edge-fleet keys generate`` says where each key goes: a rollback key never to trusted keys.

docs/rollouts.md: the rollback key's private half is ``serve --rollback-key``, its public half goes
only to the agents' ``[updater] rollback_keys_dir`` (an agent refuses a key in both dirs).
"""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from fleet import operator_cli
from fleet.cli import build_parser


def _generate(tmp_path: Path, *extra: str) -> tuple[int, str]:
    lines: list[str] = []
    args = build_parser().parse_args(["keys", "generate", "--out", str(tmp_path), *extra])
    rc = operator_cli.run(args, out=lines.append)
    return rc, "\n".join(lines)


@pytest.mark.parametrize("extra", [
    ("--key-id", "fleet-rollback"),
    ("--key-id", "site2", "--role", "rollback"),
    ("--role", "rollback"),
])
def test_rollback_key_hint(tmp_path: Path, extra: tuple[str, ...]) -> None:
    rc, text = _generate(tmp_path, *extra)
    assert rc == 0
    (priv,) = tmp_path.glob("*.key")
    assert "(rollback key)" in text
    assert f"edge-fleet serve --rollback-key {priv}" in text
    assert "rollback_keys_dir" in text
    public = next(line for line in text.splitlines() if line.startswith("public"))
    assert "copy to the agents' [updater] rollback_keys_dir only" in public
    assert "copy to the fleet's --trusted-keys" not in text


@pytest.mark.parametrize("extra", [("--key-id", "ops"), ("--key-id", "fleet-rollback",
                                                         "--role", "package"), ()])
def test_package_key_hint(tmp_path: Path, extra: tuple[str, ...]) -> None:
    rc, text = _generate(tmp_path, *extra)
    assert rc == 0
    assert "(package key)" in text
    assert ("copy to the fleet's --trusted-keys dir and the agents' [updater] trusted_keys_dir"
            in text)
    assert "--rollback-key" not in text and "rollback_keys_dir" not in text


def test_unknown_role_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["keys", "generate", "--out", str(tmp_path), "--role", "x"])
    assert exc.value.code == 2
    assert "invalid choice: 'x'" in capsys.readouterr().err


def test_doctests() -> None:
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(operator_cli.key_role):
        runner.run(test)
    summary = runner.summarize(verbose=False)
    assert summary.attempted >= 1
    assert summary.failed == 0
