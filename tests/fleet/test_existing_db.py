"""The database commands refuse a fleet database that is not there (exit 78, one line naming the
path and ``--create-db``) instead of creating a second, empty fleet; ``--create-db`` creates and
migrates it. On real SQLite files and a real, empty PostgreSQL database."""

from __future__ import annotations

import shlex
import sqlite3
import subprocess
from pathlib import Path

import pytest

from fleet.cli import EX_CONFIG, main
from fleet.db import migrate
from fleet.db.engine import make_engine
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN, fresh_pg_database

#: One command of each kind that opens the database (serve creates it, on purpose).
COMMANDS = [
    ["device", "add", "gw1"], ["device", "list"], ["device", "revoke", "gw1"],
    ["device", "tag", "gw1", "--add", "x"], ["user", "list"], ["token", "list"],
    ["audit", "list"], ["webhook", "list"], ["jobs", "list"], ["db", "upgrade"],
]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == EX_CONFIG
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_missing_database_is_refused_and_not_created(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "fleet-stat" / "fleet.db"
    err = _refused([*command, "--db", f"sqlite:///{typo}", "--state-dir", str(tmp_path)], capsys)
    assert err == (f"edge-fleet: configuration error: no fleet database at {typo}: check --db / "
                   "--state-dir (or $EDGE_FLEET_DB), or give --create-db to create a new fleet "
                   "database there")
    assert not typo.parent.exists()


def test_the_state_dir_default_is_checked_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "no-such-state"
    err = _refused(["device", "add", "gw1", "--state-dir", str(state)], capsys)
    assert f"no fleet database at {state / 'fleet.db'}:" in err and "--create-db" in err
    assert not state.exists()


def test_an_empty_file_or_another_sqlite_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    err = _refused(["device", "add", "gw1", "--db", f"sqlite:///{empty}"], capsys)
    assert f"{empty} is an empty file, not a fleet database:" in err and "--create-db" in err
    assert empty.stat().st_size == 0
    other = tmp_path / "agent.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE outbox (id INTEGER)")
    err = _refused(["user", "list", "--db", f"sqlite:///{other}"], capsys)
    assert f"{other} holds no fleet database (no fleet schema):" in err
    with sqlite3.connect(other) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"outbox"}


def test_create_db_creates_and_migrates_then_plain_commands_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "new" / "fleet.db"
    common = ["--db", f"sqlite:///{db}", "--state-dir", str(tmp_path)]
    assert main(["device", "add", "gw1", "--create-db", *common]) == 0
    assert db.stat().st_size > 0
    engine = make_engine(Settings(db_url=f"sqlite:///{db}", admin_token=ADMIN_TOKEN))
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()
    capsys.readouterr()
    assert main(["device", "list", *common]) == 0
    assert "gw1" in capsys.readouterr().out
    # --create-db on an existing fleet changes nothing
    assert main(["device", "list", "--create-db", *common]) == 0
    assert "gw1" in capsys.readouterr().out
    empty = tmp_path / "empty.db"
    empty.touch()
    assert main(["db", "upgrade", "--create-db", "--db", f"sqlite:///{empty}"]) == 0


@pytest.mark.parametrize("create", [False, True], ids=["", "create-db"])
def test_what_is_not_a_fleet_database_is_refused_and_left_untouched(
    create: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another program's SQLite file, a file of garbage and a directory: exit 78 with one line
    naming the path, with or without --create-db, and not a byte written."""
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE foo (x INTEGER)")
        conn.execute("INSERT INTO foo VALUES (1)")
    conn.close()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all, " * 100)
    folder = tmp_path / "dir.db"
    folder.mkdir()
    flag = ["--create-db"] if create else []
    for path, why in ((other, "holds tables of something else (foo)"),
                      (garbage, "is not a SQLite database"), (folder, "is not a file")):
        before = path.read_bytes() if path.is_file() else None
        err = _refused(["device", "add", "gw1", "--db", f"sqlite:///{path}", *flag], capsys)
        assert str(path) in err and why in err, err
        if before is not None:
            assert path.read_bytes() == before
    with sqlite3.connect(other) as conn:
        assert [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")] == ["foo"]
    conn.close()


def test_an_empty_postgresql_database_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with fresh_pg_database("fleet_empty", revision=None) as url:
        err = _refused(["device", "list", "--db", url], capsys)
        assert err.startswith(f"edge-fleet: configuration error: {url} holds no fleet database")
        assert "--create-db" in err
        assert main(["device", "add", "gw1", "--db", url, "--create-db"]) == 0
        capsys.readouterr()
        assert main(["device", "list", "--db", url]) == 0
        assert "gw1" in capsys.readouterr().out


REPO = Path(__file__).resolve().parents[2]


def _fleet_quick_start() -> list[str]:
    """The shell lines of the README's fleet quick start block (comments dropped)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Quick start: fleet sync end to end", 1)[1].split("```sh\n", 1)[1]
    return [ln.split("  #", 1)[0].strip() for ln in block.split("\n```", 1)[0].splitlines()]


def test_the_readme_fleet_quick_start_works_in_order_on_a_fresh_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every ``edge-fleet`` database command of the block runs as written, in order, in an empty
    directory; the database exists before ``serve &`` starts (nothing races the server)."""
    monkeypatch.chdir(tmp_path)
    ran: list[str] = []
    for line in _fleet_quick_start():
        argv = shlex.split(line.removesuffix("&").strip())
        if argv[:1] == ["mkdir"]:
            subprocess.run(["bash", "-c", line], check=True, timeout=30)
        elif argv[:2] == ["edge-fleet", "serve"]:
            assert (tmp_path / "fleet-state" / "fleet.db").stat().st_size > 0, \
                "serve & starts before any command created the fleet database"
        elif argv[:1] == ["edge-fleet"]:
            assert main(argv[1:]) == 0, (line, capsys.readouterr().err)
        ran.append(argv[1] if argv[0] == "edge-fleet" else argv[0])
    assert ran.index("device") < ran.index("serve")
    assert (tmp_path / "gw1.token").read_text().strip()
