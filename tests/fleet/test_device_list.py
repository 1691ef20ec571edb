"""``edge-fleet device list`` shows each device's enrolment (enrolled / pending / revoked) and
connection (online / offline / never, by last contact against ``--offline-after``), on a real
SQLite file."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import update

from fleet.cli import EX_CONFIG, main
from fleet.db.devices import DeviceRegistry
from fleet.db.engine import make_engine
from fleet.db.schema import devices
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN


def _rows(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["DEVICE", "ENROLMENT", "CONNECTION"]
    return {ln.split()[0]: ln.split()[1:3] for ln in lines[1:]}


def test_enrolment_and_connection_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--db", f"sqlite:///{tmp_path / 'fleet.db'}", "--state-dir", str(tmp_path)]
    for device in ("fresh", "live", "quiet", "gone", "again"):
        assert main(["device", "add", device, "--create-db", *common]) == 0
    engine = make_engine(Settings(db_url=f"sqlite:///{tmp_path / 'fleet.db'}",
                                  admin_token=ADMIN_TOKEN))
    now = dt.datetime.now(dt.timezone.utc)
    try:
        with engine.begin() as conn:
            for device, ago_s in (("live", 5), ("quiet", 600), ("gone", 30), ("again", 60)):
                conn.execute(update(devices).where(devices.c.device_id == device)
                             .values(created_at=now - dt.timedelta(hours=1),
                                     last_seen=now - dt.timedelta(seconds=ago_s)))
        registry = DeviceRegistry(engine)
        registry.revoke("gone")
        registry.revoke("again")
        registry.enroll("again", [])  # a new token, not used yet: its old contacts don't count
    finally:
        engine.dispose()
    capsys.readouterr()

    assert main(["device", "list", *common]) == 0
    assert _rows(capsys.readouterr().out) == {
        "again": ["pending", "online"],
        "fresh": ["pending", "never"],   # enrolled, its token never used
        "live": ["enrolled", "online"],
        "quiet": ["enrolled", "offline"],  # silent 600 s > the default 300 s
    }
    assert main(["device", "list", "--all", "--offline-after", "900", *common]) == 0
    assert _rows(capsys.readouterr().out) == {
        "again": ["pending", "online"],
        "fresh": ["pending", "never"], "gone": ["revoked", "online"],
        "live": ["enrolled", "online"], "quiet": ["enrolled", "online"],
    }
    for bad in ("0", "inf", "1e309", "2592001"):  # serve's range: 0..30 days
        assert main(["device", "list", "--offline-after", bad, *common]) == EX_CONFIG
        assert "--offline-after" in capsys.readouterr().err


def test_a_closed_pipe_ends_the_command_without_a_traceback(tmp_path: Path) -> None:
    """``edge-fleet device list | head -1`` (or ``rollout show``): the reader is gone before the
    table is written; the command exits 141 (as killed by SIGPIPE), with nothing on stderr."""
    common = ["--db", f"sqlite:///{tmp_path / 'fleet.db'}", "--state-dir", str(tmp_path)]
    assert main(["device", "add", "gw1", "--create-db", *common]) == 0
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "fleet.cli", "device", "list", *common],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                              check=False)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")
