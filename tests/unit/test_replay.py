"""ReplaySource over small generated CSV files, with a fake clock for pacing."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from agent.cli import main
from agent.errors import RecordError, SourceError, SourceExhausted, SourceFailed
from agent.records import Reading
from agent.sources.replay import ReplayConfig, ReplaySource

SKAB_HEADER = (
    "datetime;Accelerometer1RMS;Accelerometer2RMS;Current;Pressure;Temperature;Thermocouple;"
    "Voltage;Volume Flow RateRMS;anomaly;changepoint"
)
SKAB_CHANNELS = (
    "Accelerometer1RMS",
    "Accelerometer2RMS",
    "Current",
    "Pressure",
    "Temperature",
    "Thermocouple",
    "Voltage",
    "Volume Flow RateRMS",
)
T0 = 1583748873.0  # 2020-03-09 10:14:33 UTC


def skab_file(tmp_path: Path, rows: list[str] | None = None, n: int = 5) -> Path:
    if rows is None:
        rows = [
            f"2020-03-09 10:14:{33 + i};0.02{i};0.04;1.3;0.05;79.3;26.0;233.0;32.0;0.0;0.0"
            for i in range(n)
        ]
    path = tmp_path / "skab.csv"
    path.write_text("\n".join([SKAB_HEADER, *rows]) + "\n", encoding="utf-8")
    return path


class Collector:
    def __init__(self) -> None:
        self.readings: list[Reading] = []
        self.rejects: list[RecordError] = []

    def run(self, source: ReplaySource, stop: threading.Event | None = None) -> None:
        with pytest.raises(SourceExhausted):
            source.run(self.readings.append, self.rejects.append, stop or threading.Event())


class FakeTime:
    """Monotonic clock that only advances when the source sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_skab_layout_channels_labels_ignored_and_timestamps(tmp_path: Path) -> None:
    src = ReplaySource(ReplayConfig(path=str(skab_file(tmp_path))), "pump")
    assert src.channels == SKAB_CHANNELS
    c = Collector()
    c.run(src)
    assert len(c.readings) == 5
    assert [r.ts for r in c.readings] == [T0 + i for i in range(5)]
    first = c.readings[0]
    assert first.stream == "pump"
    assert first.values.dtype == np.float64
    assert first.values.shape == (8,)
    assert first.values[0] == pytest.approx(0.020)
    assert first.values[-1] == pytest.approx(32.0)


def test_comma_with_epoch_ms_time_column(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("a,ts,b\n1,1700000000000,2\n3,1700000000500,4\n")
    cfg = ReplayConfig(path=str(path), time_column="ts", time_format="epoch_ms")
    src = ReplaySource(cfg, "s")
    assert src.channels == ("a", "b")
    c = Collector()
    c.run(src)
    assert [r.ts for r in c.readings] == [1_700_000_000.0, 1_700_000_000.5]
    assert [r.values.tolist() for r in c.readings] == [[1.0, 2.0], [3.0, 4.0]]


def test_auto_time_format_epoch_seconds_and_iso(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("time,x\n1700000000,1\n2023-11-14T22:13:21Z,2\n2023-11-14T23:13:22+01:00,3\n")
    c = Collector()
    c.run(ReplaySource(ReplayConfig(path=str(path), time_column="time"), "s"))
    assert [r.ts for r in c.readings] == [1_700_000_000.0, 1_700_000_001.0, 1_700_000_002.0]


def test_channel_selection_order(tmp_path: Path) -> None:
    cfg = ReplayConfig(path=str(skab_file(tmp_path)), channels=["Voltage", "Current"])
    src = ReplaySource(cfg, "s")
    assert src.channels == ("Voltage", "Current")
    c = Collector()
    c.run(src)
    assert c.readings[0].values.tolist() == [233.0, 1.3]


def test_missing_channel_names_missing_and_present_columns(tmp_path: Path) -> None:
    cfg = ReplayConfig(path=str(skab_file(tmp_path)), channels=["Current", "Speed", "Torque"])
    with pytest.raises(SourceError) as info:
        ReplaySource(cfg, "s")
    msg = str(info.value)
    assert "'Speed'" in msg and "'Torque'" in msg
    assert "Volume Flow RateRMS" in msg  # the columns present are listed


def test_missing_time_column(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(SourceError, match="no time column 'datetime'"):
        ReplaySource(ReplayConfig(path=str(path)), "s")


def test_missing_file_error_message(tmp_path: Path) -> None:
    path = tmp_path / "nope.csv"
    with pytest.raises(SourceError) as info:
        ReplaySource(ReplayConfig(path=str(path)), "s")
    assert str(path) in str(info.value)
    assert info.value.retryable


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(SourceError, match="empty"):
        ReplaySource(ReplayConfig(path=str(path)), "s")


def test_bad_rows_rejected_individually_good_rows_pass(tmp_path: Path) -> None:
    good = "2020-03-09 10:14:{:02d};0.02;0.04;1.3;0.05;79.3;26.0;233.0;32.0;0.0;0.0"
    rows = [
        good.format(0),
        "2020-03-09 10:14:01;0.02;abc;1.3;0.05;79.3;26.0;233.0;32.0;0.0;0.0",  # non_numeric
        good.format(2),
        "2020-03-09 10:14:03;0.02;nan;1.3;0.05;79.3;26.0;233.0;32.0;0.0;0.0",  # non_finite
        "2020-03-09 10:14:04;0.02;1e999;1.3;0.05;79.3;26.0;233.0;32.0;0.0;0.0",  # non_finite
        "2020-03-09 10:14:05;0.02;0.04",  # field_count
        "yesterday;0.02;0.04;1.3;0.05;79.3;26.0;233.0;32.0;0.0;0.0",  # bad_timestamp
        "",  # blank line: skipped, not a reject
        good.format(8),
        "2020-03-09 10:14:09;0.02;0.04;1.3;0.05;79.3;26.0;233.0;32.0;x;y",  # labels not read
    ]
    src = ReplaySource(ReplayConfig(path=str(skab_file(tmp_path, rows))), "s")
    events: list[str] = []

    def emit(r: Reading) -> None:
        events.append(f"ok@{int(r.ts - T0 + 33)}")

    def reject(e: RecordError) -> None:
        events.append(e.reason)

    with pytest.raises(SourceExhausted, match="readings=4"):
        src.run(emit, reject, threading.Event())
    assert events == [
        "ok@0",
        "non_numeric",
        "ok@2",
        "non_finite",
        "non_finite",
        "field_count",
        "bad_timestamp",
        "ok@8",
        "ok@9",
    ]


def test_bad_row_carries_line_number(tmp_path: Path) -> None:
    rows = ["2020-03-09 10:14:33;1;1;1;1;1;1;1;1;0;0", "2020-03-09 10:14:34;1;1;1;zz;1;1;1;1;0;0"]
    c = Collector()
    c.run(ReplaySource(ReplayConfig(path=str(skab_file(tmp_path, rows))), "s"))
    assert len(c.rejects) == 1
    assert c.rejects[0].context["line"] == 3


def test_speed_one_paces_from_timestamps_without_drift(tmp_path: Path) -> None:
    ft = FakeTime()
    emitted_at: list[float] = []
    src = ReplaySource(
        ReplayConfig(path=str(skab_file(tmp_path, n=4)), speed=1.0),
        "s",
        sleep=ft.sleep,
        monotonic=ft.monotonic,
    )

    def emit(r: Reading) -> None:
        emitted_at.append(ft.now)
        ft.now += 0.3  # a slow consumer must not add up to drift

    with pytest.raises(SourceExhausted):
        src.run(emit, lambda e: None, threading.Event())
    assert emitted_at == pytest.approx([100.0, 101.0, 102.0, 103.0])
    assert ft.sleeps == pytest.approx([0.7, 0.7, 0.7])


def test_speed_n_is_n_times_faster(tmp_path: Path) -> None:
    ft = FakeTime()
    src = ReplaySource(
        ReplayConfig(path=str(skab_file(tmp_path, n=5)), speed=4.0),
        "s",
        sleep=ft.sleep,
        monotonic=ft.monotonic,
    )
    c = Collector()
    c.run(src)
    assert ft.now == pytest.approx(101.0)  # 4 s of file time in 1 s
    assert len(c.readings) == 5


def test_speed_zero_never_sleeps(tmp_path: Path) -> None:
    ft = FakeTime()
    src = ReplaySource(
        ReplayConfig(path=str(skab_file(tmp_path)), speed=0.0),
        "s",
        sleep=ft.sleep,
        monotonic=ft.monotonic,
    )
    Collector().run(src)
    assert ft.sleeps == []


def test_stop_during_pacing_returns(tmp_path: Path) -> None:
    stop = threading.Event()
    src = ReplaySource(
        ReplayConfig(path=str(skab_file(tmp_path)), speed=1.0), "s", sleep=lambda s: stop.set()
    )
    out: list[Reading] = []
    src.run(out.append, lambda e: None, stop)  # returns instead of raising SourceExhausted
    assert len(out) == 1


def test_restamp_keeps_spacing_from_clock(tmp_path: Path) -> None:
    src = ReplaySource(
        ReplayConfig(path=str(skab_file(tmp_path, n=3)), restamp=True), "s", clock=lambda: 5000.0
    )
    c = Collector()
    c.run(src)
    assert [r.ts for r in c.readings] == [5000.0, 5001.0, 5002.0]


def test_loop_continues_timeline_until_stopped(tmp_path: Path) -> None:
    src = ReplaySource(ReplayConfig(path=str(skab_file(tmp_path, n=3)), loop=True), "s")
    stop = threading.Event()
    out: list[Reading] = []

    def emit(r: Reading) -> None:
        out.append(r)
        if len(out) == 7:
            stop.set()

    src.run(emit, lambda e: None, stop)
    assert [r.ts - T0 for r in out] == [0, 1, 2, 3, 4, 5, 6]


def test_a_file_without_one_valid_row_fails_for_good(tmp_path: Path) -> None:
    # looped or not: it ends (no endless spin) as failed, not exhausted (the agent exits 69)
    rows = ["2020-03-09 10:14:33;x;1;1;1;1;1;1;1;0;0"]
    for loop in (True, False):
        src = ReplaySource(ReplayConfig(path=str(skab_file(tmp_path, rows)), loop=loop), "s")
        rejected: list[RecordError] = []
        with pytest.raises(SourceFailed, match="no valid row"):
            src.run(lambda r: None, rejected.append, threading.Event())
        assert [e.reason for e in rejected] == ["non_numeric"]


def test_a_looping_file_emptied_between_passes_fails_not_finishes(tmp_path: Path) -> None:
    # a looping replay never ends normally: a later pass without one valid row (the file
    # truncated to its header) is a failure (stream 'down'), not an exhaustion ('finished')
    path = skab_file(tmp_path, n=3)
    header = path.read_text().splitlines()[0]
    out: list[Reading] = []

    def emit(r: Reading) -> None:
        out.append(r)
        if len(out) == 3:  # the first pass's last row: empty the file before the next pass
            path.write_text(header + "\n")

    src = ReplaySource(ReplayConfig(path=str(path), loop=True), "s")
    with pytest.raises(SourceFailed, match="no valid row"):
        src.run(emit, lambda e: None, threading.Event())
    assert len(out) == 3


def test_explicit_delimiter_tab(tmp_path: Path) -> None:
    path = tmp_path / "t.tsv"
    path.write_text("datetime\tx\n2020-03-09 10:14:33\t1.5\n")
    c = Collector()
    c.run(ReplaySource(ReplayConfig(path=str(path), delimiter="\t"), "s"))
    assert [r.values.tolist() for r in c.readings] == [[1.5]]


def test_unpaced_replay_of_a_skab_sized_file_never_waits(tmp_path: Path) -> None:
    """speed = 0 replays 1,150 s of rows without pacing: the source never calls its sleep.
    (How fast it is is a benchmark's question, not a test's.)"""
    n = 1150
    rows = [
        f"2020-03-09 {10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d};"
        "0.0265878;0.0401113;1.3302;0.054711;79.3366;26.0199;233.062;32.0;0.0;0.0"
        for i in range(n)
    ]
    sleeps: list[float] = []
    src = ReplaySource(ReplayConfig(path=str(skab_file(tmp_path, rows)), speed=0.0), "s",
                       sleep=sleeps.append)
    count = 0

    def emit(r: Reading) -> None:
        nonlocal count
        count += 1

    with pytest.raises(SourceExhausted):
        src.run(emit, lambda e: None, threading.Event())
    assert count == n
    assert sleeps == []


DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


@pytest.mark.dataset
def test_real_skab_valve1_file() -> None:
    path = DATASETS / "skab" / "valve1" / "0.csv"
    if not path.is_file():
        pytest.skip(f"SKAB dataset not found at {path} (needs ../shared/datasets)")
    src = ReplaySource(ReplayConfig(path=str(path)), "pump")
    assert src.channels == SKAB_CHANNELS
    c = Collector()
    c.run(src)
    assert len(c.readings) == 1147
    assert c.rejects == []
    assert all(r.values.shape == (8,) for r in c.readings)
    assert c.readings[0].ts == T0  # 2020-03-09 10:14:33, naive = UTC


@pytest.mark.parametrize("first_line", [
    "datetime;" + "1" * 200_000,          # one field over the csv module's 131072 limit
    "x" * 70_000 + ";datetime;Current",   # a first line too long to be a header
], ids=["huge-field", "huge-line"])
def test_a_first_line_that_is_no_csv_header_is_a_source_error(
        tmp_path: Path, first_line: str) -> None:
    path = tmp_path / "notcsv.csv"
    path.write_text(first_line + "\n2020-03-09 10:14:33;1.0\n")
    with pytest.raises(SourceError, match="not a CSV header") as info:
        ReplaySource(ReplayConfig(path=str(path)), "s")
    assert len(str(info.value)) < 500  # the line itself is not echoed


def test_check_config_on_a_replay_file_with_a_huge_first_field_exits_78(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "dump.csv"
    data.write_text("datetime;" + "1" * 200_000 + "\n")
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\ndevice_id = "gw"\nstate_dir = "st"\n[[streams]]\nname = "s"\n'
        'model = "builtin:skab-wstat"\n[streams.source]\nkind = "replay"\npath = "dump.csv"\n'
    )
    assert main(["check-config", str(config)]) == 78
    err = capsys.readouterr().err
    assert "streams[0].source.path: replay file's first line is longer than 65536" in err
    assert main(["run", "--config", str(config)]) == 78
