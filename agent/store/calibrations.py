"""The ``calibrations`` table (schema version 3): one stream's calibration in force, per row.

Functions over a connection the :class:`~agent.store.sqlite.Store` holds (its lock, transaction
and error mapping): :meth:`Store.save_calibration` and :meth:`Store.calibration` call them. What a
row means and when it may be restored: :mod:`agent.pipeline.restore`.
"""

from __future__ import annotations

import json
import sqlite3

import numpy as np

from agent.pipeline.restore import (
    CalibrationKey,
    StoredCalibration,
    calibration_from_json,
    calibration_to_json,
)

_SAVE = ("INSERT OR REPLACE INTO calibrations (stream, model_name, model_version, package_sha256,"
         " spec_sha256, spec, calibration, fitted_at, samples, readings)"
         " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_LOAD = ("SELECT stream, model_name, model_version, package_sha256, spec_sha256, spec, calibration,"
         " fitted_at, samples, readings FROM calibrations WHERE stream = ?")


def save(conn: sqlite3.Connection, rec: StoredCalibration) -> None:
    """Insert or replace the row of ``rec.stream`` (call inside a transaction)."""
    k = rec.key
    readings = (None if rec.readings is None
                else np.ascontiguousarray(rec.readings, dtype="<f8").tobytes())
    conn.execute(
        _SAVE,
        (rec.stream, k.model_name, k.model_version, k.package_sha256, k.spec_sha256,
         json.dumps(k.spec, separators=(",", ":")), calibration_to_json(rec.calibration),
         float(rec.fitted_at), int(rec.samples), readings),
    )


def load(conn: sqlite3.Connection, stream: str) -> StoredCalibration | None:
    """The row of ``stream``, or None.

    Raises:
        ValueError: the row does not parse (its key or calibration JSON, or readings whose
            size is not ``samples`` × channels).
    """
    row = conn.execute(_LOAD, (stream,)).fetchone()
    if row is None:
        return None
    _, name, version, package_sha, spec_sha, spec_text, cal_text, fitted_at, samples, blob = row
    try:
        spec = json.loads(spec_text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"stored detector settings are not JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise ValueError("stored detector settings are not a JSON object")
    key = CalibrationKey(str(name), int(version), str(package_sha), spec)
    if key.spec_sha256 != spec_sha:
        raise ValueError("stored detector settings do not match their sha256")
    cal = calibration_from_json(str(cal_text))
    readings = None
    if blob is not None:
        channels = cal.scaler.mean.shape[0]
        if len(blob) != int(samples) * channels * 8:
            raise ValueError(f"stored readings hold {len(blob)} bytes, not {samples} × "
                             f"{channels} float64")
        readings = np.frombuffer(blob, dtype="<f8").astype(np.float64).reshape(-1, channels)
    return StoredCalibration(stream, key, cal, float(fitted_at), int(samples), readings)
