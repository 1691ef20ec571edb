"""benchmarks/univariate.py: CSV in, CSV out, through the shipped univariate package.

The generated folder holds a long file with a level shift, a short file (fewer rows than the
calibration length), a file with garbage rows and epoch timestamps in a sub-folder, and a file
without the columns. The dataset-marked test runs the benchmark on a few SKAB channels written
as ``timestamp,value`` files. No figure is asserted.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ROOT.parent / "shared" / "datasets"
SCRIPT = ROOT / "benchmarks" / "univariate.py"
SUMMARY = (r"files=\d+ rows=\d+ rejected=\d+ unscored_files=\d+ alarms=\d+ "
           r"in_alarm=\d\.\d{4}")


def _run(data: Path, out: Path, *extra: str) -> list[str]:
    done = subprocess.run([sys.executable, str(SCRIPT), "--data", str(data), "--out", str(out),
                           *extra],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def _write(path: Path, rows: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp", "value"])
        w.writerows(rows)


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_benchmark_reads_and_writes_every_csv(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    t0 = dt.datetime(2014, 4, 1)
    long = 20.0 + 0.5 * rng.normal(size=3000)
    long[2000:2300] += 6.0
    _write(tmp_path / "data" / "long.csv", [
        ((t0 + dt.timedelta(minutes=5 * i)).strftime("%Y-%m-%d %H:%M:%S"), f"{v:.4f}")
        for i, v in enumerate(long)])
    _write(tmp_path / "data" / "short.csv", [
        ((t0 + dt.timedelta(minutes=i)).strftime("%Y-%m-%d %H:%M:%S"), f"{v:.4f}")
        for i, v in enumerate(rng.normal(size=150))])
    garbage = [(str(1396310400 + 60 * i), f"{v:.4f}") for i, v in enumerate(rng.normal(size=700))]
    garbage[150] = (garbage[150][0], "n/a")
    garbage[600] = ("yesterday", "1.0")
    _write(tmp_path / "data" / "sub" / "epoch.csv", garbage)
    (tmp_path / "data" / "wrong.csv").write_text("time,reading\n1,2\n", encoding="utf-8")
    lines = _run(tmp_path / "data", tmp_path / "out")
    assert re.fullmatch(SUMMARY, lines[-1]), lines[-1]
    assert any(line.startswith("wrong.csv: skipped") for line in lines)

    out = _read(tmp_path / "out" / "long.csv")
    assert len(out) == 3000 and list(out[0]) == ["timestamp", "value", "score", "alarm",
                                                 "in_alarm"]
    assert out[0]["timestamp"] == "2014-04-01 00:00:00" and out[0]["score"] == ""
    assert {r["alarm"] for r in out} <= {"0", "1"}
    alarms = [i for i, r in enumerate(out) if r["alarm"] == "1"]
    assert any(2000 <= i < 2300 for i in alarms), alarms  # the sustained shift is alarmed
    # calibration: the first N = 400 rows whatever the file's length (what a device does)
    n_cal = sum(r["score"] == "" for r in out[:1000])
    assert 400 <= n_cal < 450 and all(r["score"] != "" for r in out[n_cal:])

    short = _read(tmp_path / "out" / "short.csv")  # 150 rows < N + W: written unscored
    assert len(short) == 150 and all(r["score"] == "" for r in short)
    assert re.search(r"^short\.csv: .*too short to calibrate", "\n".join(lines), re.M)

    epoch = _read(tmp_path / "out" / "sub" / "epoch.csv")
    assert len(epoch) == 700 and any(r["score"] != "" for r in epoch)
    for i in (150, 600):  # kept as they were, unscored, never an alarm
        assert epoch[i]["score"] == "" and epoch[i]["alarm"] == "0"
    assert epoch[150]["value"] == "n/a" and epoch[600]["timestamp"] == "yesterday"
    assert epoch[601]["score"] != ""
    assert re.search(r"^sub/epoch\.csv: rows=700 rejected=2 ", "\n".join(lines), re.M)


def test_a_file_too_short_to_calibrate_is_written_unscored(tmp_path: Path) -> None:
    _write(tmp_path / "data" / "tiny.csv", [(str(i), "1.5") for i in range(12)])
    lines = _run(tmp_path / "data", tmp_path / "out")
    assert "unscored" in lines[0]
    assert lines[-1].endswith("unscored_files=1 alarms=0 in_alarm=0.0000")
    out = _read(tmp_path / "out" / "tiny.csv")
    assert len(out) == 12 and all(r["score"] == "" and r["alarm"] == "0" for r in out)


@pytest.mark.dataset
def test_benchmark_on_derived_skab_series(tmp_path: Path) -> None:
    skab = DATASETS / "skab"
    if not skab.is_dir():
        pytest.skip("needs ../shared/datasets/skab")
    sys.path.insert(0, str(ROOT / "models" / "recipes"))
    from skab_data import labelled_files, read_skab  # noqa: PLC0415

    for path in labelled_files(skab)[:3]:
        f = read_skab(path)
        for c in (0, 4):  # Accelerometer1RMS, Temperature
            _write(tmp_path / "data" / path.parent.name / f"{path.stem}_{c}.csv",
                   [(str(1_600_000_000 + i), repr(float(v))) for i, v in
                    enumerate(f.values[:, c])])
    lines = _run(tmp_path / "data", tmp_path / "out")
    assert re.fullmatch(SUMMARY, lines[-1]), lines[-1]
    assert len(list((tmp_path / "out").rglob("*.csv"))) == 6


def _spikes(tmp_path: Path, package: Path) -> None:
    """R1 and R2 (models/recipes/univariate_select.py) on generated noise, through the
    benchmark with ``package``: an 8 sigma spike of 1 row and of 3 rows, up or down, and a
    4 sigma step of 50 rows each raise an alarm within W rows after they end; the stretches
    between them raise none."""
    window = int(json.loads((package / "manifest.json").read_text())["input"]["window"])
    x = 20.0 + 0.5 * np.random.default_rng(3).normal(size=4000)
    sigma = float(x[:400].std())
    placed = [(1000, 1, 8.0), (1500, 1, -8.0), (2000, 3, 8.0), (2500, 3, -8.0),
              (3000, 50, 4.0), (3500, 50, -4.0)]
    for p, length, offset in placed:
        x[p : p + length] += offset * sigma
    _write(tmp_path / "data" / "spikes.csv",
           [(str(1_600_000_000 + 60 * i), f"{v:.6f}") for i, v in enumerate(x)])
    _run(tmp_path / "data", tmp_path / "out", "--model", str(package))
    alarms = [i for i, r in enumerate(_read(tmp_path / "out" / "spikes.csv"))
              if r["alarm"] == "1"]
    for p, length, offset in placed:
        assert any(p <= i < p + length + window for i in alarms), (p, length, offset, alarms)
    assert all(any(p <= i < p + length + window for p, length, _ in placed) for i in alarms), \
        alarms


def test_the_shipped_package_alarms_on_point_anomalies_and_short_shifts(tmp_path: Path) -> None:
    _spikes(tmp_path, ROOT / "models" / "univariate-wstat")


def test_the_single_window_path_reaches_the_benchmark(tmp_path: Path) -> None:
    """The manifest's ``rule_spike`` is the rule the benchmark runs (as a deployed stream): a
    +20 sigma spike of 1 row raises nothing with the shipped package set to 10 of 10 (a spike
    touches W < 10 windows) and an alarm within W rows with that package and ``rule_spike``
    2.0 (one window above 2 x threshold); the noise none."""
    x = 20.0 + 0.5 * np.random.default_rng(3).normal(size=2000)
    x[1500] += 20 * float(x[:400].std())
    _write(tmp_path / "data" / "spike.csv",
           [(str(1_600_000_000 + 60 * i), f"{v:.6f}") for i, v in enumerate(x)])
    pkg = tmp_path / "pkg"
    shutil.copytree(ROOT / "models" / "univariate-wstat", pkg)
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert manifest["univariate"].get("rule_spike") is None
    window = int(manifest["input"]["window"])
    assert window < 10
    manifest["univariate"].update(rule_k=10, rule_n=10)
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    _run(tmp_path / "data", tmp_path / "off", "--model", str(pkg))
    assert not any(r["alarm"] == "1" for r in _read(tmp_path / "off" / "spike.csv"))
    manifest["univariate"]["rule_spike"] = 2.0
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    _run(tmp_path / "data", tmp_path / "on", "--model", str(pkg))
    alarms = [i for i, r in enumerate(_read(tmp_path / "on" / "spike.csv")) if r["alarm"] == "1"]
    assert len(alarms) == 1 and 1500 <= alarms[0] < 1501 + window, alarms



def test_a_file_with_a_byte_order_mark_and_a_value_beyond_float32_is_read_as_the_agent_would(
        tmp_path: Path) -> None:
    """A UTF-8 BOM before the header skipped the file; 1e39 was scored (off-scale) where the
    agent rejects it as out of range."""
    rng = np.random.default_rng(4)
    lines = ["timestamp,value"] + [f"{1_700_000_000 + 60 * i},{v:.4f}"
                                   for i, v in enumerate(rng.normal(size=600))]
    lines[550] = f"{1_700_000_000 + 60 * 549},1e39"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bom.csv").write_bytes(("\ufeff" + "\n".join(lines) + "\n").encode())
    last = _run(tmp_path / "in", tmp_path / "out")[-1]
    assert re.fullmatch(SUMMARY, last), last
    assert "files=1 rows=600 rejected=1 unscored_files=0" in last, last
