"""Read SKAB CSV files (``;``-separated, ``datetime`` column, labels) for recipes and benchmarks.

SKAB: Katser & Kozitsin, "Skoltech Anomaly Benchmark (SKAB)", 2020, github.com/waico/SKAB.
The dataset root is always a parameter: nothing here copies data into the repository.
"""

from __future__ import annotations

import csv
import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

LABEL_COLUMNS = ("anomaly", "changepoint")
TIME_COLUMN = "datetime"


@dataclass(frozen=True)
class SkabFile:
    """One SKAB file.

    Attributes:
        path: The CSV file.
        channels: Channel names in column order.
        values: Shape ``(T, C)``, float64, in the channels' units.
        anomaly: Shape ``(T,)``, int8 0/1 labels, or None for unlabelled files.
        times: Shape ``(T,)``, int64 seconds of the ``datetime`` column (naive, read as UTC),
            or None when not read.
    """

    path: Path
    channels: tuple[str, ...]
    values: npt.NDArray[np.float64]
    anomaly: npt.NDArray[np.int8] | None
    times: npt.NDArray[np.int64] | None = None


def read_skab(path: Path) -> SkabFile:
    """Read one SKAB CSV file.

    Raises:
        ValueError: The file has no ``datetime`` column, a non-numeric value or a timestamp
            that is not ``YYYY-MM-DD HH:MM:SS``.
    """
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh, delimiter=";"))
    header = rows[0]
    if TIME_COLUMN not in header:
        raise ValueError(f"{path}: no {TIME_COLUMN!r} column in header {header}")
    idx = [i for i, c in enumerate(header) if c != TIME_COLUMN and c not in LABEL_COLUMNS]
    values = np.array([[float(r[i]) for i in idx] for r in rows[1:]], dtype=np.float64)
    anomaly = None
    if "anomaly" in header:
        a = header.index("anomaly")
        anomaly = np.array([round(float(r[a])) for r in rows[1:]], dtype=np.int8)
    t = header.index(TIME_COLUMN)
    try:
        times = np.array([_seconds(r[t]) for r in rows[1:]], dtype=np.int64)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return SkabFile(path, tuple(header[i] for i in idx), values, anomaly, times)


def _seconds(text: str) -> int:
    stamp = dt.datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")
    return int(stamp.replace(tzinfo=dt.timezone.utc).timestamp())


def _span(f: SkabFile) -> tuple[int, int]:
    assert f.times is not None and f.times.size
    return int(f.times.min()), int(f.times.max())


def overlapping_rows(times: npt.NDArray[np.int64], labelled: list[SkabFile]
                     ) -> npt.NDArray[np.bool_]:
    """Shape ``(T,)``: rows whose timestamp ``times`` (seconds) falls inside the time span
    (first to last timestamp, inclusive) of any ``labelled`` file: rows of the same recording
    session as a file that is scored, which may repeat its rows (SKAB's anomaly-free recording
    ends with the first 572 rows of ``other/5.csv``)."""
    out = np.zeros(times.shape[0], dtype=bool)
    for f in labelled:
        if f.times is None or not f.times.size:  # a file without rows spans no time
            continue
        lo, hi = _span(f)
        out |= (times >= lo) & (times <= hi)
    return out


def training_recording(root: Path) -> SkabFile:
    """The anomaly-free recording without the rows that overlap a labelled file in time
    (:func:`overlapping_rows`), for every choice and held-out figure judged on labelled files.

    Raises:
        FileNotFoundError: no anomaly-free recording (:func:`anomaly_free_file`).
        ValueError: no row is left.
    """
    af = read_skab(anomaly_free_file(root))
    assert af.times is not None
    labelled = [read_skab(p) for p in labelled_files(root)]
    keep = ~overlapping_rows(af.times, labelled)
    if not keep.any():
        raise ValueError(f"{af.path}: every row overlaps a labelled file")
    out = replace(af, values=af.values[keep], times=af.times[keep],
                  anomaly=None if af.anomaly is None else af.anomaly[keep])
    assert_disjoint(out, labelled)
    return out


def assert_disjoint(training: SkabFile, labelled: list[SkabFile]) -> None:
    """Check that no row of ``training`` lies in a labelled file's time span.

    Raises:
        ValueError: ``training`` has rows in some labelled file's span (names the file).
    """
    assert training.times is not None
    for f in labelled:
        n = int(overlapping_rows(training.times, [f]).sum())
        if n:
            raise ValueError(f"{training.path}: {n} training rows fall inside the time span of "
                             f"the labelled file {f.path}")


def sessions(files: list[SkabFile]) -> list[list[SkabFile]]:
    """Recording sessions: files whose time spans overlap, transitively, are one session
    (SKAB's ``other/2``, ``/3`` and ``/4`` share rows). Files keep their order inside a session;
    sessions are ordered by their first file's position in ``files``.

    Files that only touch (one ends a second before the next starts) share no row and stay
    separate sessions; so does a file without rows.
    """
    parent = list(range(len(files)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    spans = [_span(f) if f.times is not None and f.times.size else None for f in files]
    for i, span_i in enumerate(spans):
        for j in range(i):
            span_j = spans[j]
            if (span_i is not None and span_j is not None and span_i[0] <= span_j[1]
                    and span_j[0] <= span_i[1]):
                parent[find(i)] = find(j)
    out: dict[int, list[SkabFile]] = {}
    for i, f in enumerate(files):
        out.setdefault(find(i), []).append(f)
    return list(out.values())


def labelled_files(root: Path) -> list[Path]:
    """Every labelled SKAB file under ``root`` (any sub-folder except ``anomaly-free``), sorted."""
    return sorted(
        p for p in root.rglob("*.csv") if "anomaly-free" not in p.parts and p.is_file()
    )


def anomaly_free_file(root: Path) -> Path:
    """The long anomaly-free recording used for training.

    Raises:
        FileNotFoundError: ``root/anomaly-free/anomaly-free.csv`` is missing.
    """
    path = root / "anomaly-free" / "anomaly-free.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no anomaly-free recording at {path}")
    return path
