"""A replay file with an over-long line: the row is rejected (``too_long``) without being read
whole, the rows after it are replayed, and memory stays bounded (a hostile 100 MB line cost
twice its size in RSS when the csv module read it whole)."""

from __future__ import annotations

import csv
import doctest
import io
import json
import logging
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.cli import main
from agent.errors import RecordError, SourceExhausted
from agent.metrics import Metrics
from agent.records import Reading
from agent.services.supervisor import SourceSupervisor
from agent.sources import bounded_lines, replay
from agent.sources.bounded_lines import BoundedLines
from agent.sources.replay import MAX_ROW_CHARS, ReplayConfig, ReplaySource

HEADER = "datetime;a;b"
ROW = "2020-03-09 10:14:{:02d};{}.5;2"


def write_recording(path: Path, long_chars: int, *, fields: bool = False) -> None:
    """Header, two rows, one row of ``long_chars`` characters, two rows; written in 1 MiB
    pieces so the test itself never holds the long line. ``fields``: the long row is many
    short fields (``1;1;1...``) rather than one huge field."""
    piece = ("1;" * (1 << 19)) if fields else ("7" * (1 << 20))
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write("\n".join([HEADER, ROW.format(0, 0), ROW.format(1, 1)]) + "\n")
        f.write("2020-03-09 10:14:02;")
        left = long_chars - len("2020-03-09 10:14:02;")
        while left > 0:
            f.write(piece[:left])
            left -= len(piece)
        f.write("\r\n" + ROW.format(3, 3) + "\n" + ROW.format(4, 4) + "\n")


def run_replay(path: Path) -> tuple[list[str], list[RecordError]]:
    events: list[str] = []
    rejects: list[RecordError] = []

    def emit(r: Reading) -> None:
        events.append(f"ok{r.values[0]:g}")

    def reject(e: RecordError) -> None:
        events.append(e.reason)
        rejects.append(e)

    with pytest.raises(SourceExhausted):
        ReplaySource(ReplayConfig(path=str(path)), "s").run(emit, reject, threading.Event())
    return events, rejects


@pytest.mark.parametrize("fields", [False, True], ids=["one-field", "many-fields"])
def test_an_over_long_row_is_rejected_in_order_and_the_next_rows_are_read(
        tmp_path: Path, fields: bool) -> None:
    path = tmp_path / "rec.csv"
    write_recording(path, 3 * MAX_ROW_CHARS, fields=fields)
    events, rejects = run_replay(path)
    assert events == ["ok0.5", "ok1.5", "too_long", "ok3.5", "ok4.5"]
    assert rejects[0].context["line"] == 4
    assert str(rejects[0]) == (f"row of {3 * MAX_ROW_CHARS} characters skipped: longer than "
                               f"{MAX_ROW_CHARS} (line=4)")


@pytest.mark.parametrize(("extra", "expected"), [(0, "ok2.5"), (1, "too_long")],
                         ids=["at-limit", "one-over"])
def test_a_row_of_exactly_the_limit_is_accepted(
        tmp_path: Path, extra: int, expected: str) -> None:
    # ten wide columns: a single field over 131072 characters is refused by the csv module
    header = HEADER + "".join(f";x{i}" for i in range(10))
    prefix = "2020-03-09 10:14:02;2.5;2"
    width, left = divmod(MAX_ROW_CHARS + extra - len(prefix), 10)
    wide = prefix + "".join(";" + "0" * (width - 1 + (i < left)) for i in range(10))
    assert len(wide) == MAX_ROW_CHARS + extra
    rows = [ROW.format(i, i) + ";0" * 10 for i in (0, 1, 3, 4)]
    path = tmp_path / "rec.csv"
    path.write_text("\r\n".join([header, *rows[:2], wide, *rows[2:]]) + "\r\n", newline="")
    events, _ = run_replay(path)
    assert events == ["ok0.5", "ok1.5", expected, "ok3.5", "ok4.5"]


_RSS_CHILD = textwrap.dedent("""
    import json, resource, sys, threading
    from agent.errors import SourceExhausted
    from agent.sources.replay import ReplayConfig, ReplaySource
    src = ReplaySource(ReplayConfig(path=sys.argv[1]), "s")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ok, rejected = [], []
    try:
        src.run(ok.append, lambda e: rejected.append(e.reason), threading.Event())
    except SourceExhausted:
        pass
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"readings": len(ok), "rejected": rejected, "grown_kib": grown}))
""")


def test_a_100_mb_line_costs_little_memory(tmp_path: Path) -> None:
    path = tmp_path / "hostile.csv"
    size = 100 << 20
    write_recording(path, size)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(path)], capture_output=True,
                          text=True, timeout=240, check=True, cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    result = json.loads(done.stdout)
    assert result["readings"] == 4
    # Reading the line whole grew the peak RSS by about twice the line (200 MiB); bounded
    # reading holds MAX_ROW_CHARS plus one chunk.
    assert result["grown_kib"] * 1024 < size // 10, result
    assert result["rejected"] == ["too_long"]


def test_the_supervisor_logs_one_warning_and_counts_the_row(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "rec.csv"
    write_recording(path, 2 * MAX_ROW_CHARS)
    metrics = Metrics(CollectorRegistry())
    out: list[Reading] = []
    sup = SourceSupervisor(ReplaySource(ReplayConfig(path=str(path)), "s"), out.append,
                           metrics, threading.Event(), logging.getLogger("test.replay"))
    with caplog.at_level(logging.WARNING, logger="test.replay"):
        sup.start()
        sup.join(30.0)
    assert sup.done
    assert len(out) == 4
    assert metrics.registry.get_sample_value(
        "edge_agent_records_rejected_total", {"stream": "s", "reason": "too_long"}) == 1.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"stream s: record rejected (too_long): row of {2 * MAX_ROW_CHARS} "
                        f"characters skipped: longer than {MAX_ROW_CHARS} (line=4)"]


def test_probe_reports_the_over_long_row_and_the_rows_after_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_recording(tmp_path / "rec.csv", 2 * MAX_ROW_CHARS, fields=True)
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\ndevice_id = "gw"\nstate_dir = "st"\n[[streams]]\nname = "s"\n'
        'model = "builtin:skab-wstat"\n[streams.source]\nkind = "replay"\npath = "rec.csv"\n'
        'channels = ["a", "b"]\n'
    )
    assert main(["probe", "--config", str(config), "--seconds", "5"]) == 0
    out = capsys.readouterr().out
    assert "REJECTED too_long: row of" in out
    assert "s: 4 readings, 1 rejected (too_long 1), 0 errors" in out


def lines_of(text: str, max_chars: int, chunk_chars: int = 3) -> list[str]:
    """Every line or ``!N`` (a too_long rejection at line N), as BoundedLines hands them out."""
    lines = BoundedLines(io.StringIO(text, newline=""), max_chars, chunk_chars)
    out: list[str] = []
    while True:
        try:
            out.append(next(lines))
        except StopIteration:
            return out
        except RecordError as exc:
            out.append(f"!{exc.context['line']}")


@pytest.mark.parametrize(("text", "expected"), [
    ("abcd\nabcde\nx\n", ["abcd\n", "!2", "x\n"]),
    ("abcd\r\nabcde\r\nx\r\n", ["abcd\r\n", "!2", "x\r\n"]),  # "\r\n" split by the bound
    ("abcde\r\n\r\nx", ["!1", "\r\n", "x"]),  # a blank line after it is still a line
    ("abcdef\rx\r", ["!1", "x\r"]),  # "\r" alone ends lines too
    ("a\rbcdefgh\r\n\nx", ["a\r", "!2", "\n", "x"]),
    ("abcdefghijk", ["!1"]),  # the file ends inside the long line
    ("abcd", ["abcd"]),
], ids=["lf", "crlf-split", "crlf-blank", "cr", "long-after-cr", "eof", "eof-ok"])
def test_bounded_lines_terminators(text: str, expected: list[str]) -> None:
    assert lines_of(text, 4) == expected


def test_a_quoted_record_over_several_lines_counts_as_one_row() -> None:
    lines = BoundedLines(io.StringIO('a\n"12\n34\n56"\nb\n', newline=""), 5)
    reader = csv.reader(lines)
    got: list[object] = []
    while True:
        lines.start_record()
        try:
            got.append(next(reader))
        except StopIteration:
            break
        except RecordError as exc:
            got.append(exc.reason)
    assert got[:2] == [["a"], "too_long"]
    assert got[-1] == ["b"]


@pytest.mark.parametrize("module", [bounded_lines, replay], ids=lambda m: m.__name__)
def test_doctests(module: object) -> None:
    assert doctest.testmod(module).failed == 0  # type: ignore[arg-type]
