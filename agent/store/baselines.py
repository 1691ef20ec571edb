"""The ``baselines`` table (schema version 8): one univariate stream's adapted baseline, per row.

Functions over a connection the :class:`~agent.store.sqlite.Store` holds (its lock, transaction
and error mapping): :meth:`Store.save_baseline`, :meth:`Store.baseline` and
:meth:`Store.forget_baseline` call them. What a row means and when it is resumed:
:mod:`agent.pipeline.baseline_restore`.
"""

from __future__ import annotations

import json
import math
import sqlite3

import numpy as np

from agent.pipeline.baseline_restore import StoredBaseline, baseline_from_json, baseline_to_json
from agent.pipeline.restore import CalibrationKey

_SAVE = ("INSERT OR REPLACE INTO baselines (stream, model_name, model_version, package_sha256,"
         " spec_sha256, spec, calibration_sha256, baseline, saved_at)"
         " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
_LOAD = ("SELECT model_name, model_version, package_sha256, spec_sha256, spec,"
         " calibration_sha256, baseline, saved_at FROM baselines WHERE stream = ?")


def save(conn: sqlite3.Connection, rec: StoredBaseline) -> None:
    """Insert or replace the row of ``rec.stream``.

    Raises:
        ValueError: a centre or scale is not finite (nothing is written).
    """
    k = rec.key
    conn.execute(
        _SAVE,
        (rec.stream, k.model_name, k.model_version, k.package_sha256, k.spec_sha256,
         json.dumps(k.spec, separators=(",", ":")), rec.calibration_sha256,
         baseline_to_json(rec.centre, rec.scale), float(rec.saved_at)),
    )


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"stored {what} is not text")
    return value


def load(conn: sqlite3.Connection, stream: str) -> StoredBaseline | None:
    """The row of ``stream``, or None.

    Raises:
        ValueError: the row does not parse: a column of the wrong type, detector settings that
            are not a JSON object or do not match their sha256, a baseline that is not
            :func:`~agent.pipeline.baseline_restore.baseline_to_json` output.
    """
    row = conn.execute(_LOAD, (stream,)).fetchone()
    if row is None:
        return None
    name, version, package_sha, spec_sha, spec_text, cal_sha, text, saved_at = row
    if not isinstance(version, int) or isinstance(saved_at, str | bytes) or saved_at is None:
        raise ValueError("stored model version or save time of the wrong type")
    try:
        spec = json.loads(_text(spec_text, "detector settings"))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"stored detector settings are not JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise ValueError("stored detector settings are not a JSON object")
    key = CalibrationKey(_text(name, "model name"), version, _text(package_sha, "package sha256"),
                         spec)
    if key.spec_sha256 != spec_sha:
        raise ValueError("stored detector settings do not match their sha256")
    centre, scale = baseline_from_json(_text(text, "baseline"))
    if not math.isfinite(float(saved_at)):
        raise ValueError("stored save time is not finite")
    return StoredBaseline(stream, key, _text(cal_sha, "calibration sha256"),
                          np.asarray(centre, np.float64), np.asarray(scale, np.float64),
                          float(saved_at))


def forget(conn: sqlite3.Connection, stream: str) -> None:
    """Delete the row of ``stream`` (none: nothing happens)."""
    conn.execute("DELETE FROM baselines WHERE stream = ?", (stream,))
