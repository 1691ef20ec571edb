"""Alert ids after a store that silently lost its tail, on real SQLite files.

The crash image is a copy of the database and its WAL taken while the agent runs (what a
power cut leaves). Damaging one WAL frame of the last commits makes SQLite drop those commits at
the next open without any error (the WAL is replayed up to the first frame whose checksum
fails; ``quick_check`` passes). Format: https://www.sqlite.org/fileformat2.html#walformat
(32-byte header; frames of a 24-byte header, whose bytes 4-7 hold the database size after a
commit frame and 0 otherwise, followed by one page).
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from agent.records import Alert
from agent.store.sqlite import Store

pytestmark = pytest.mark.integration

WAL_HEADER = 32
FRAME_HEADER = 24


def alert(seq: int) -> Alert:
    return Alert(alert_id=f"gw1:pump1:{seq}", device_id="gw1", stream="pump1", seq=seq,
                 model_name="ae", model_version=1, score=2.0, threshold=1.0,
                 window_start=1_700_000_000.0, window_end=1_700_000_001.0,
                 raised_at=1_700_000_001.0, top_channels=())


def commit_frames(wal: bytes) -> list[int]:
    """Offsets of the frames that end a transaction (commit frames), in WAL order."""
    page = struct.unpack(">I", wal[8:12])[0]
    out, off = [], WAL_HEADER
    while off + FRAME_HEADER + page <= len(wal):
        if struct.unpack(">I", wal[off + 4:off + 8])[0]:
            out.append(off)
        off += FRAME_HEADER + page
    return out


def crash_image(src: Path, dst: Path) -> None:
    """Copy the store's files as a power cut leaves them (the WAL not checkpointed)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name.startswith("agent.db") and not f.name.endswith("-reserve"):
            shutil.copy2(f, dst / f.name)


def test_ids_are_not_reused_when_sqlite_drops_the_last_commits(tmp_path: Path) -> None:
    live = tmp_path / "live"
    store = Store(live / "agent.db")
    for _ in range(3):
        store.add_new_alert("pump1", alert)
    store.checkpoint()  # alerts 1-3 in the database file, the WAL empty
    delivered = [store.add_new_alert("pump1", alert).alert_id for _ in range(3)]  # 4-6: WAL
    image = tmp_path / "image"
    crash_image(live, image)
    store.close()

    wal_path = image / "agent.db-wal"
    wal = bytearray(wal_path.read_bytes())
    commits = commit_frames(bytes(wal))
    assert len(commits) >= 3, "alerts 4-6 should be three transactions in the WAL"
    page = struct.unpack(">I", wal[8:12])[0]
    first_of_5 = commits[-3] + FRAME_HEADER + page  # the frame after alert 4's commit
    wal[first_of_5 + FRAME_HEADER + 100] ^= 0xFF  # one flipped byte: its checksum fails
    wal_path.write_bytes(bytes(wal))

    reopened = Store(image / "agent.db")
    try:
        assert reopened.quarantined is None  # SQLite reported nothing
        ids = [a["alert_id"] for a in reopened.alerts()]
        assert ids == [f"gw1:pump1:{i}" for i in (1, 2, 3, 4)]  # 5 and 6 silently gone
        new = reopened.add_new_alert("pump1", alert)
        assert new.alert_id not in delivered, "an id already delivered was issued again"
        assert new.seq == 7
        assert reopened.last_alert_seq("pump1") == 7
    finally:
        reopened.close()


def test_ledger_survives_a_quarantined_store(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store = Store(path, clock=lambda: 0.0)  # wall clock at 0: the ms jump adds nothing
    for _ in range(5):
        store.add_new_alert("pump1", alert)
    store.close()
    path.write_bytes(b"this is not a database" * 100)
    fresh = Store(path, clock=lambda: 0.0)
    try:
        assert fresh.quarantined is not None
        assert fresh.add_new_alert("pump1", alert).seq == 6
    finally:
        fresh.close()
