"""``edge-fleet webhook ...`` against a real SQLite file, and serve's option checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.cli import EX_CONFIG, EX_REFUSED, main


def test_webhook_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", f"sqlite:///{tmp_path / 'fleet.db'}", "--state-dir", str(tmp_path)]
    secret = tmp_path / "hook.secret"
    secret.write_text("a-long-enough-secret-value\n")
    assert main(["webhook", "add", "https://hooks.example/edge", "--events",
                 "alert,device_offline", "--secret-file", str(secret), "--create-db", *db]) == 0
    assert "webhook 1: https://hooks.example/edge (alert,device_offline)" in capsys.readouterr().out
    assert main(["webhook", "list", *db]) == 0
    listed = capsys.readouterr().out
    assert "https://hooks.example/edge" in listed and "a-long-enough" not in listed
    assert main(["webhook", "deliveries", "--state", "dead", *db]) == 0
    assert main(["webhook", "add", "https://h/x", "--events", "bogus", "--secret-file",
                 str(secret), *db]) == EX_REFUSED
    assert main(["webhook", "add", "https://h/x", "--events", "alert", "--secret-file",
                 str(tmp_path / "missing"), *db]) == EX_CONFIG
    assert main(["webhook", "redeliver", "99", *db]) == EX_REFUSED
    assert main(["webhook", "remove", "1", *db]) == 0
    assert main(["webhook", "remove", "1", *db]) == EX_REFUSED


@pytest.mark.parametrize("option", [["--retention", "alerts=forever"],
                                    ["--offline-after", "0"],
                                    ["--webhook-max-attempts", "0"],
                                    ["--webhook-timeout", "900"]])
def test_serve_refuses_bad_options(tmp_path: Path, option: list[str]) -> None:
    assert main(["serve", "--db", f"sqlite:///{tmp_path / 'f.db'}", "--state-dir",
                 str(tmp_path), *option]) == EX_CONFIG
