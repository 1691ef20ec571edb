"""Read SKAB CSV files (``;``-separated, ``datetime`` column, labels) for recipes and benchmarks.

SKAB: Katser & Kozitsin, "Skoltech Anomaly Benchmark (SKAB)", 2020, github.com/waico/SKAB.
The dataset root is always a parameter: nothing here copies data into the repository.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
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
    """

    path: Path
    channels: tuple[str, ...]
    values: npt.NDArray[np.float64]
    anomaly: npt.NDArray[np.int8] | None


def read_skab(path: Path) -> SkabFile:
    """Read one SKAB CSV file.

    Raises:
        ValueError: The file has no ``datetime`` column or a non-numeric value.
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
    return SkabFile(path, tuple(header[i] for i in idx), values, anomaly)


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
