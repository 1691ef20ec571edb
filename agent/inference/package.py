"""Load and verify a model package directory (format: :mod:`cloud_sync.manifest`).

Verification before anything runs: the manifest parses against the schema; every artefact's size
and sha256 match; the chosen artefact reproduces the golden outputs within the tolerance. A package
that fails any check raises :class:`agent.errors.ModelError` and is never used.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from agent.errors import ModelError
from agent.inference.base import Backend
from agent.inference.registry import artefacts_for, build_backend
from agent.pipeline.detector import Calibration, DetectorSpec
from agent.pipeline.drift import LevelAdaptation
from agent.pipeline.univariate_detector import UnivariateParams
from cloud_sync.calibration import FeatureStats, Scaler
from cloud_sync.manifest import Artefact, Manifest

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ModelPackage:
    """A verified package on disk.

    Attributes:
        path: The package directory.
        manifest: The parsed manifest.
    """

    path: Path
    manifest: Manifest

    @property
    def label(self) -> str:
        """``name@version`` for logs and metrics."""
        return f"{self.manifest.name}@{self.manifest.version}"

    def artefact(self, runtime: str, precision: str) -> Artefact:
        """The artefact for ``runtime`` and ``precision``.

        Raises:
            ModelError: the package has none.
        """
        for art in self.manifest.artefacts:
            if art.runtime == runtime and art.precision == precision:
                return art
        have = [f"{a.runtime}/{a.precision}" for a in self.manifest.artefacts]
        raise ModelError(
            f"no {runtime}/{precision} artefact (package has {have})", model=self.label
        )

    def detector_spec(
        self,
        *,
        window: int | None = None,
        hop: int | None = None,
        calibration_samples: int | None = None,
        threshold_quantile: float | None = None,
        threshold_factor: float | None = None,
    ) -> DetectorSpec:
        """Build the detector spec, with optional per-stream overrides.

        Raises:
            ModelError: an override conflicts with the artefact (the window is baked into the
                ONNX graph's shape, so it cannot change).
        """
        m = self.manifest
        if window is not None and window != m.input.window:
            raise ModelError(
                f"window {window} differs from the model's fixed window {m.input.window}",
                model=self.label,
            )
        return DetectorSpec(
            channels=tuple(m.input.channels),
            window=m.input.window,
            hop=hop if hop is not None else m.input.hop,
            calibration_samples=calibration_samples or m.preprocessing.calibration_samples,
            scale_floor=np.asarray(m.preprocessing.scale_floor, dtype=np.float64),
            n_features=len(m.score.features),
            top_k=m.score.top_k,
            feature_std_floor=np.asarray(m.score.feature_std_floor, dtype=np.float64),
            threshold_quantile=threshold_quantile or m.score.threshold.quantile,
            threshold_factor=threshold_factor or m.score.threshold.factor,
            threshold_holdout=m.score.threshold.holdout,
        )

    def adaptation(self) -> LevelAdaptation | None:
        """The bounded per-channel level adaptation of a multichannel package (the manifest's
        ``score.adaptation``, :mod:`agent.pipeline.drift`), or None (off).

        Raises:
            ModelError: the package adapts but its first feature is not the window ``mean``.
        """
        a = self.manifest.score.adaptation
        if a is None:
            return None
        if self.manifest.score.features[0] != "mean":
            raise ModelError("score.adaptation adapts the 'mean' feature, which must come "
                             f"first (features {self.manifest.score.features})", model=self.label)
        return LevelAdaptation(a.rate, a.bound)

    def univariate_params(self) -> UnivariateParams | None:
        """Gap and drift-adaptation parameters of a one-channel package (the manifest's
        ``univariate`` section), or None for a multichannel package."""
        u = self.manifest.univariate
        if u is None:
            return None
        return UnivariateParams(u.gap_factor, u.scale_floor_rel, u.adapt_rate, u.adapt_below,
                                u.drift_bound, u.threshold_sigma, u.scale_rate, u.clip,
                                u.scale_bound)

    def preset_calibration(self) -> Calibration | None:
        """The calibration fitted in the cloud for one device, when the package carries one.

        A stream built with it scores from its first window (no calibration period). The
        manifest's ``fitted_on`` names the device and stream it was fitted for; the composition
        root uses it only on that device.

        Returns:
            Scaler ``(C,)``, feature statistics ``(F,)`` and threshold; ``scores`` is empty (the
            calibration windows' scores stay in the cloud). None when the manifest has none.
        """
        cal = self.manifest.calibration
        if cal is None:
            return None
        return Calibration(
            Scaler(np.asarray(cal.mean, np.float64), np.asarray(cal.scale, np.float64)),
            FeatureStats(
                np.asarray(cal.feature_mean, np.float64), np.asarray(cal.feature_std, np.float64)
            ),
            float(cal.threshold),
            np.zeros(0, np.float64),
        )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def load_package(path: Path) -> ModelPackage:
    """Read and verify ``path/manifest.json`` and the artefacts' sizes and hashes.

    Raises:
        ModelError: missing directory or manifest, an image package (``kind = "image"``: a
            camera stream's model), invalid JSON or schema, a shape mismatch
            between manifest fields, a missing artefact, or a size/sha256 mismatch.
    """
    if not path.is_dir():
        raise ModelError("model package directory does not exist", path=path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise ModelError("model package has no manifest.json", path=path)
    try:
        obj = json.loads(mpath.read_text(encoding="utf-8"))
        if isinstance(obj, dict) and obj.get("kind") == "image":
            raise ModelError(
                f"{obj.get('name', path.name)} is an image model; use a camera source "
                "([streams.source] kind = \"camera\") or a sensor model package", path=path)
        manifest = Manifest.model_validate(obj)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"manifest.json is not valid JSON: {exc}", path=path) from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ModelError(f"manifest.json does not match the schema: {problems}", path=path) from exc
    c = len(manifest.input.channels)
    f = len(manifest.score.features) * c
    if (
        len(manifest.input.units) != c
        or len(manifest.preprocessing.scale_floor) != c
        or len(manifest.score.feature_std_floor) != f
    ):
        raise ModelError("manifest field lengths disagree with the channel count", path=path)
    u = manifest.univariate
    if u is not None and (c != 1 or u.rule_k > u.rule_n):
        raise ModelError("manifest univariate: needs exactly one channel and rule_k <= rule_n "
                         f"(has {c} channels, rule {u.rule_k} of {u.rule_n})", path=path)
    cal = manifest.calibration
    if cal is not None and (
        len(cal.mean) != c or len(cal.scale) != c or len(cal.feature_mean) != f
        or len(cal.feature_std) != f or min(cal.scale) <= 0 or min(cal.feature_std) <= 0
    ):
        raise ModelError(
            "manifest calibration: lengths disagree with the channel/feature count or a "
            "scale/std is not positive",
            path=path,
        )
    label = f"{manifest.name}@{manifest.version}"
    for art in manifest.artefacts:
        apath = path / art.path
        if not apath.is_file() or apath.resolve().parent != path.resolve():
            raise ModelError(f"artefact {art.path} is missing", model=label)
        if apath.stat().st_size != art.size_bytes:
            raise ModelError(
                f"artefact {art.path} has {apath.stat().st_size} bytes, manifest says "
                f"{art.size_bytes}",
                model=label,
            )
        if _sha256(apath) != art.sha256:
            raise ModelError(f"artefact {art.path} fails its sha256 check", model=label)
    return ModelPackage(path, manifest)


def check_golden(package: ModelPackage, backend: Backend) -> float:
    """Run the golden inputs through ``backend`` and compare with the expected outputs.

    Returns:
        The largest absolute error.

    Raises:
        ModelError: an output differs by more than the package's tolerance.
    """
    g = package.manifest.golden
    x = np.asarray(g.inputs, dtype=np.float32)
    want = np.asarray(g.outputs, dtype=np.float32)
    got = backend.run(x)
    if got.shape != want.shape:
        raise ModelError(
            f"golden output shape {got.shape} != expected {want.shape}", model=package.label
        )
    err = float(np.abs(got - want).max())
    if not err <= g.atol:
        raise ModelError(
            f"golden vectors differ by {err:.4g} > tolerance {g.atol} "
            f"({backend.name}/{backend.precision})",
            model=package.label,
        )
    return err


def open_backend(
    package: ModelPackage,
    precision: str = "int8",
    threads: int = 1,
    runtime: str = "onnxruntime",
    cache_dir: Path | None = None,
) -> Backend:
    """Load the ``runtime`` backend on its ``precision`` artefact and check the golden vectors.

    OpenVINO runs its own IR artefact when the package has one, else the ONNX artefact
    (:func:`agent.inference.registry.artefacts_for`). To pick the fastest runtime that passes, see
    :func:`agent.inference.select.select_backend`.

    Args:
        package: A verified package.
        precision: ``int8`` or ``fp32``.
        threads: Threads of the runtime.
        runtime: A registered runtime (:mod:`agent.inference.registry`).
        cache_dir: OpenVINO's compiled-model cache (ignored by the other runtimes).

    Raises:
        ModelError: no such artefact, it does not load, or it fails the golden check.
        agent.errors.BackendUnavailable: the runtime is not installed (names the extra).
    """
    arts = artefacts_for(package, runtime, precision)
    if not arts:
        package.artefact(runtime, precision)  # raises: names what the package has
    backend = build_backend(runtime, package.path / arts[0].path, precision,
                            threads=threads, cache_dir=cache_dir)
    check_golden(package, backend)
    return backend


def saturation_fallback(
    package: ModelPackage, artefact: Artefact
) -> tuple[Backend | None, tuple[float, float] | None]:
    """The FP32 twin that scores windows outside an INT8 artefact's ``input_range``.

    Returns:
        ``(fp32 backend, input range)``, or ``(None, None)`` when ``artefact`` is not INT8, has
        no recorded input range, or the package has no FP32 ONNX artefact.

    Raises:
        ModelError: the FP32 artefact exists but fails to load or its golden check.
    """
    if artefact.precision != "int8" or artefact.input_range is None:
        return None, None
    if not any(a.runtime == "onnxruntime" and a.precision == "fp32"
               for a in package.manifest.artefacts):
        return None, None
    return open_backend(package, "fp32"), artefact.input_range
