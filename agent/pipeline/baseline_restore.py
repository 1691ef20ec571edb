"""The adapted baseline of a univariate stream kept across restarts: its key, JSON form and checks.

Pure code (hashing and JSON, no I/O): the store (:mod:`agent.store.baselines`) keeps one
:class:`StoredBaseline` per stream, written by :mod:`agent.services.baselines`, and the stream
resumes it at start only when it belongs to what the stream runs now.

The robust baseline (:mod:`agent.pipeline.robust`) is a centre and a scale per feature ``(F,)``
that start at the calibration's feature statistics and then follow the stream within bounds set
around that start. What it depends on is what the calibration depends on (its
:class:`~agent.pipeline.restore.CalibrationKey`: the package by name, version and manifest
sha256, the detector settings, the artefact's precision) plus the calibration itself (its
:func:`calibration_sha256`), since the bounds and the feature units are taken from it. The start
(``centre0``, ``scale0``) and whether the baseline is bounded are not stored: they follow from the
calibration.

Two ways a stored baseline is not used, both leaving the stream on its calibration's baseline:

* :func:`stale`: it belongs to another package, other detector settings or another calibration
  (a model update, a recalibration): a normal event, one INFO line.
* :func:`baseline_from_json` or :func:`agent.pipeline.robust.resume_state` raise ValueError: the
  row is not a baseline this code wrote (wrong shape, a value that is not a finite number, a
  value beyond the drift or scale bound): one WARNING line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.pipeline.detector import Calibration
from agent.pipeline.restore import CalibrationKey, calibration_to_json, key_refusal
from agent.records import FloatArray

#: Format of :func:`baseline_to_json`.
FORMAT = 1


def calibration_sha256(cal: Calibration) -> str:
    """sha256 (hex) of the calibration's JSON form (:func:`agent.pipeline.restore.
    calibration_to_json`): equal for a calibration and its stored, restored copy."""
    return hashlib.sha256(calibration_to_json(cal).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredBaseline:
    """One stream's adapted baseline as kept in the store.

    Attributes:
        stream: Stream name.
        key: The calibration key of the model and settings it was adapted under.
        calibration_sha256: :func:`calibration_sha256` of the calibration it started from.
        centre: Shape ``(F,)``, float64, the feature centres, calibration sigmas.
        scale: Shape ``(F,)``, float64, the feature scales (robust stds), calibration sigmas.
        saved_at: When it was saved, epoch s UTC.
    """

    stream: str
    key: CalibrationKey
    calibration_sha256: str
    centre: FloatArray
    scale: FloatArray
    saved_at: float


def baseline_to_json(centre: FloatArray, scale: FloatArray) -> str:
    """Serialise a baseline's centres and scales (float64 values round-trip exactly).

    Raises:
        ValueError: a value is not finite.

    >>> baseline_from_json(baseline_to_json(np.array([0.5, 1.0]), np.array([2.0, 3.0])))
    ([0.5, 1.0], [2.0, 3.0])
    """
    return json.dumps({"format": FORMAT, "centre": np.asarray(centre, np.float64).tolist(),
                       "scale": np.asarray(scale, np.float64).tolist()},
                      separators=(",", ":"), allow_nan=False)


def _numbers(d: dict[str, Any], name: str) -> list[float]:
    values = d.get(name)
    if not isinstance(values, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ValueError(f"'{name}' is not a list of numbers")
    try:
        return [float(v) for v in values]
    except OverflowError as exc:  # an integer beyond float64
        raise ValueError(f"'{name}' holds a number beyond float64") from exc


def baseline_from_json(text: str) -> tuple[list[float], list[float]]:
    """Parse :func:`baseline_to_json` output into (centres, scales); their lengths, finiteness
    and bounds are :func:`agent.pipeline.robust.resume_state`'s to check.

    Raises:
        ValueError: not JSON, not that format, or a list that holds something else than
            numbers.
    """
    try:
        d = json.loads(text)
    except (TypeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    if d.get("format") != FORMAT:
        raise ValueError(f"unknown baseline format {d.get('format')!r}")
    return _numbers(d, "centre"), _numbers(d, "scale")


def stale(stored: StoredBaseline, key: CalibrationKey, cal: Calibration | None) -> str | None:
    """Why ``stored`` does not belong to a stream whose calibration key is ``key`` and whose
    calibration in force at start is ``cal`` (None: it calibrates afresh); None when it does.

    >>> from cloud_sync.calibration import FeatureStats, Scaler
    >>> k = CalibrationKey("m", 1, "ab", {"window": 3})
    >>> c = Calibration(Scaler(np.zeros(1), np.ones(1)),
    ...                 FeatureStats(np.zeros(3), np.ones(3)), 5.0, np.zeros(0))
    >>> b = StoredBaseline("s", k, calibration_sha256(c), np.zeros(3), np.ones(3), 0.0)
    >>> stale(b, k, c) is None, stale(b, CalibrationKey("m", 2, "cd", {"window": 3}), c)
    (True, 'model changed (m@1 → m@2)')
    >>> stale(b, k, None), stale(b, k, Calibration(c.scaler, c.features, 6.0, c.scores))
    ('the stream calibrates afresh', 'the calibration changed')
    """
    why = key_refusal(stored.key, key)
    if why is not None:
        return why
    if cal is None:
        return "the stream calibrates afresh"
    if calibration_sha256(cal) != stored.calibration_sha256:
        return "the calibration changed"
    return None
