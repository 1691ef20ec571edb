"""A fitted calibration kept across restarts: what it depends on, its JSON form, when to reuse it.

Pure code (hashing and JSON, no I/O): the store (:mod:`agent.store.calibrations`) keeps one
:class:`StoredCalibration` per stream, and the composition root restores it at start or reload
only when :func:`refusal` finds no reason against it.

A calibration is a function of the readings it was fitted on and of everything that enters
:func:`cloud_sync.calibration.fit_calibration`: the model (its package, identified by name, version
and a sha256 over its manifest, which lists every artefact's sha256), the precision of the
artefact that computed the features, and the detector spec's channels (in model order), window,
calibration length, input-scale and feature-std floors, ``top_k``, threshold quantile and factor.
That is its :class:`CalibrationKey`. The hop is left out on purpose: calibration windows are
always taken with hop 1, so a changed hop changes what is scored, not the calibration.

Which runtime ran the artefact is left out too: every runtime that runs an artefact reproduces its
golden vectors within the package's tolerance (``backend = "auto"`` may pick another one after a
restart).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.pipeline.calibration import far_out_rows
from agent.pipeline.detector import Calibration, DetectorSpec
from agent.records import FloatArray
from cloud_sync.calibration import FeatureStats, Scaler
from cloud_sync.manifest import Manifest

#: Format of :func:`calibration_to_json`.
FORMAT = 1
#: A calibration stamped later than now by more than this is from a clock that went back.
CLOCK_SLACK_S = 300.0


def _sha256_json(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def package_sha256(manifest: Manifest) -> str:
    """sha256 (hex) of the canonical manifest JSON: names every artefact by its sha256.

    The threshold's ``holdout`` is left out at its default 0 and the score's ``adaptation`` at
    its default None (both were added after packages existed), so the calibrations of a package
    built before them still match after an upgrade.
    """
    data = manifest.model_dump(mode="json")
    threshold = data.get("score", {}).get("threshold", {})
    if threshold.get("holdout") == 0.0:
        del threshold["holdout"]
    if data.get("score", {}).get("adaptation", 0) is None:
        del data["score"]["adaptation"]
    return _sha256_json(data)


@dataclass(frozen=True, slots=True)
class CalibrationKey:
    """What a calibration was fitted for (see the module docstring).

    Attributes:
        model_name: Package name.
        model_version: Package version.
        package_sha256: :func:`package_sha256` of the manifest.
        spec: The fitted-on detector settings as JSON values (keys: ``channels``, ``window``,
            ``calibration_samples``, ``scale_floor``, ``feature_std_floor``, ``n_features``,
            ``top_k``, ``threshold_quantile``, ``threshold_factor``, ``threshold_holdout`` when
            not 0, ``precision``).
    """

    model_name: str
    model_version: int
    package_sha256: str
    spec: dict[str, Any] = field(hash=False)

    @property
    def spec_sha256(self) -> str:
        """sha256 (hex) of the canonical JSON of :attr:`spec`."""
        return _sha256_json(self.spec)

    @property
    def model_label(self) -> str:
        """``name@version``."""
        return f"{self.model_name}@{self.model_version}"


def calibration_key(manifest: Manifest, spec: DetectorSpec, precision: str) -> CalibrationKey:
    """The key of a calibration fitted with ``spec`` on the ``precision`` artefact of a package.

    Args:
        manifest: The package's manifest.
        spec: The stream's detector spec.
        precision: ``int8`` or ``fp32``: the artefact whose features the calibration holds.
    """
    return CalibrationKey(
        manifest.name,
        manifest.version,
        package_sha256(manifest),
        {
            "channels": list(spec.channels),
            "window": spec.window,
            "calibration_samples": spec.calibration_samples,
            "scale_floor": [float(v) for v in spec.scale_floor],
            "feature_std_floor": [float(v) for v in spec.feature_std_floor],
            "n_features": spec.n_features,
            "top_k": spec.top_k,
            "threshold_quantile": float(spec.threshold_quantile),
            "threshold_factor": float(spec.threshold_factor),
            # only when set, so the keys of calibrations stored before it still match
            **({"threshold_holdout": float(spec.threshold_holdout)}
               if spec.threshold_holdout else {}),
            "precision": precision,
        },
    )


@dataclass(frozen=True, slots=True)
class StoredCalibration:
    """One stream's calibration as kept in the store.

    Attributes:
        stream: Stream name.
        key: What it was fitted for.
        calibration: Scaler, feature statistics, threshold and the calibration windows' scores.
        fitted_at: When it was fitted (or swapped in by a model update), epoch s UTC.
        samples: Readings it was fitted on (N).
        readings: Shape ``(N, C)``, float64, the stream's calibration readings (a model update
            calibrates its candidate on them), or None when not kept.
    """

    stream: str
    key: CalibrationKey
    calibration: Calibration
    fitted_at: float
    samples: int
    readings: FloatArray | None = None


def calibration_to_json(cal: Calibration) -> str:
    """Serialise a calibration (float64 values round-trip exactly).

    >>> c = Calibration(Scaler(np.array([1.0]), np.array([0.5])),
    ...                 FeatureStats(np.array([0.1, 0.2]), np.array([1.0, 2.0])), 5.5, np.zeros(0))
    >>> back = calibration_from_json(calibration_to_json(c))
    >>> back.threshold, back.scaler.scale.tolist(), back.features.std.tolist()
    (5.5, [0.5], [1.0, 2.0])
    """
    return json.dumps(
        {
            "format": FORMAT,
            "scaler_mean": cal.scaler.mean.tolist(),
            "scaler_scale": cal.scaler.scale.tolist(),
            "feature_mean": cal.features.mean.tolist(),
            "feature_std": cal.features.std.tolist(),
            "threshold": float(cal.threshold),
            "scores": cal.scores.tolist(),
        },
        separators=(",", ":"),
        allow_nan=False,
    )


def calibration_from_json(text: str) -> Calibration:
    """Parse :func:`calibration_to_json` output.

    Raises:
        ValueError: not that format, lengths that disagree, a non-positive scale/std or a
            non-finite value.
    """
    try:
        d = json.loads(text)
        if d.get("format") != FORMAT:
            raise ValueError(f"unknown calibration format {d.get('format')!r}")
        arr = {k: np.asarray(d[k], dtype=np.float64) for k in (
            "scaler_mean", "scaler_scale", "feature_mean", "feature_std", "scores")}
        threshold = float(d["threshold"])
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a stored calibration: {exc}") from exc
    if (
        any(a.ndim != 1 or not np.isfinite(a).all() for a in arr.values())
        or arr["scaler_mean"].shape != arr["scaler_scale"].shape
        or arr["feature_mean"].shape != arr["feature_std"].shape
        or arr["scaler_scale"].size == 0
        or (arr["scaler_scale"] <= 0).any() or (arr["feature_std"] <= 0).any()
        or not math.isfinite(threshold) or threshold <= 0
    ):
        raise ValueError("stored calibration has inconsistent or invalid values")
    return Calibration(
        Scaler(arr["scaler_mean"], arr["scaler_scale"]),
        FeatureStats(arr["feature_mean"], arr["feature_std"]),
        threshold,
        arr["scores"],
    )


def _duration(seconds: float) -> str:
    """Seconds for a log line.

    >>> _duration(90.0), _duration(7200.0), _duration(3 * 86400.0)
    ('90 s', '2.0 h', '3.0 d')
    """
    if seconds < 3600:
        return f"{seconds:.0f} s"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def spec_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two :attr:`CalibrationKey.spec`, one phrase per key.

    >>> spec_changes({"window": 10, "channels": ["a"]}, {"window": 12, "channels": ["b"]})
    ['window changed (10 → 12)', 'channels changed']
    """
    out = []
    for k in sorted(set(old) | set(new), key=lambda k: (isinstance(new.get(k), list), k)):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        scalar = not isinstance(a, list | dict) and not isinstance(b, list | dict)
        out.append(f"{k} changed ({a} → {b})" if scalar else f"{k} changed")
    return out


def key_refusal(old: CalibrationKey, key: CalibrationKey) -> str | None:
    """Why state kept for ``old`` does not belong to ``key`` (None: the same package and
    detector settings): ``model changed (a@1 → a@2)``, ``model package changed (...)`` or the
    :func:`spec_changes`. Also used for the adapted baseline (:mod:`agent.pipeline.
    baseline_restore`)."""
    if old.model_label != key.model_label:
        return f"model changed ({old.model_label} → {key.model_label})"
    if old.package_sha256 != key.package_sha256:
        return f"model package changed ({key.model_label} with other contents)"
    if old.spec_sha256 != key.spec_sha256:
        return ", ".join(spec_changes(old.spec, key.spec)) or "detector settings changed"
    return None


def refusal(
    stored: StoredCalibration, key: CalibrationKey, now: float, max_age_s: float | None
) -> str | None:
    """Why ``stored`` must not be restored for a stream whose calibration key is ``key``.

    Args:
        stored: The stored calibration.
        key: The key the stream would fit a calibration for now.
        now: Wall clock, epoch s UTC.
        max_age_s: Oldest age restored, seconds; None or inf = no limit.

    Returns:
        None when it may be restored, else the reason (one phrase for a log line): ``model
        changed (a@1 → a@2)``, ``model package changed (...)``, ``window changed (10 → 12)`` ...,
        ``calibration expired (...)``, ``calibration stamped in the future (...)``, ``it was
        fitted on 1 far-out reading(s)`` (:func:`agent.pipeline.calibration.far_out_rows`).
    """
    why = key_refusal(stored.key, key)
    if why is not None:
        return why
    if not math.isfinite(stored.calibration.threshold):
        return "its threshold is not finite"
    if stored.readings is not None and stored.readings.shape[1:] == (len(key.spec["channels"]),):
        floor = np.asarray(key.spec["scale_floor"], dtype=np.float64)
        far = int(far_out_rows(stored.readings, floor).sum())
        if far:  # fitted before far-out readings were left out of calibrations
            return f"it was fitted on {far} far-out reading(s)"
    if max_age_s is None or math.isinf(max_age_s):
        return None
    age = now - stored.fitted_at
    if age > max_age_s:
        return (f"calibration expired (fitted {_duration(age)} ago, "
                f"streams.calibration_max_age_s = {_duration(max_age_s)})")
    if age < -CLOCK_SLACK_S:
        return f"calibration stamped {_duration(-age)} in the future (the clock went back?)"
    return None
