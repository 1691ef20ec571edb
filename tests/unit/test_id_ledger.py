"""The alert-id ledger (agent.store.ids) on its own: damaged files, failed rewrites."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from agent.store.ids import MAX_LEDGER_BYTES, IdLedger


def test_marks_survive_a_restart_and_only_grow(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.db.ids")
    ledger = IdLedger(path)
    ledger.record("pump1", 5)
    ledger.record("pump1", 3)  # lower: ignored
    ledger.record("fan", 1)
    again = IdLedger(path)
    assert again.mark("pump1") == 5 and again.mark("fan") == 1 and again.mark("other") == 0
    assert not os.path.exists(path + ".tmp")


@pytest.mark.parametrize(
    "content", [b"{not json", b"[1, 2]", b"\xff\xfe", b"{}" + b" " * MAX_LEDGER_BYTES]
)
def test_a_damaged_ledger_counts_as_empty_with_one_warning(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "agent.db.ids"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="agent.store"):
        ledger = IdLedger(str(path))
    assert ledger.marks == {}
    assert len([r for r in caplog.records if "ledger" in r.getMessage()]) == 1


def test_values_that_are_not_positive_integers_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "agent.db.ids"
    path.write_text('{"a": 3, "b": "7", "c": true, "d": -1, "e": 2.5}')
    assert IdLedger(str(path)).marks == {"a": 3}


def test_a_failed_rewrite_is_logged_once_and_kept_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    folder = tmp_path / "gone"
    ledger = IdLedger(str(folder / "agent.db.ids"))  # the folder does not exist: writes fail
    with caplog.at_level(logging.INFO, logger="agent.store"):
        for seq in (1, 2, 3):
            ledger.record("pump1", seq)
        assert ledger.mark("pump1") == 3
        folder.mkdir()
        ledger.record("pump1", 4)
    texts = [r.getMessage() for r in caplog.records]
    assert sum("cannot save" in t for t in texts) == 1
    assert sum("saved again" in t for t in texts) == 1
    assert IdLedger(str(folder / "agent.db.ids")).mark("pump1") == 4
