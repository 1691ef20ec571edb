"""Model package manifest (format 1): the contract shared by the fleet, the agent and operators.

A model package is a directory holding ``manifest.json`` and the artefacts it names. The manifest
says what the model expects (channels, units, sample rate, window and hop), how the device
calibrates it, how its output becomes a score and a threshold, one artefact per runtime and
precision with its sha256, golden input vectors with expected outputs and a tolerance, the latency
budget, and the lineage (training data, FP32-vs-INT8 agreement). Signing (Ed25519 over the
canonical manifest bytes) is added by the model-loop issue; ``signature`` is reserved for it.

The canonical bytes of a manifest are ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=False).encode("utf-8")`` of the manifest without its ``signature`` key
(:func:`canonical_bytes`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

FORMAT_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """What the model reads: a window of ``window`` samples by ``len(channels)`` channels."""

    channels: list[str] = Field(min_length=1, description="Channel names, in input order.")
    units: list[str] = Field(description="Unit of each channel (same order), e.g. 'g', 'bar'.")
    sample_rate_hz: float = Field(gt=0, description="Nominal sample rate the model was built for.")
    window: int = Field(ge=2, description="Window length in samples.")
    hop: int = Field(ge=1, description="Samples between the starts of consecutive windows.")


class Preprocessing(_Strict):
    """Input scaling. ``calibrate_on_device``: z = (x - mean) / max(std, scale_floor), fitted on
    the first ``calibration_samples`` samples of each stream."""

    scaler: Literal["calibrate_on_device"] = Field(description="How the input scaler is fitted.")
    calibration_samples: int = Field(ge=2, description="Samples in the calibration period.")
    scale_floor: list[float] = Field(
        description="Per-channel lower bound of the std, in channel units (keeps a channel that "
        "was flat during calibration from turning noise into alarms)."
    )


class ThresholdSpec(_Strict):
    """threshold = quantile(threshold-base scores, ``quantile``) × ``factor``; the base is the
    calibration windows' own scores (``holdout`` 0) or the out-of-sample scores of the last
    ``holdout`` fraction of the calibration samples (:func:`cloud_sync.calibration.holdout_scores`).
    """

    kind: Literal["calibration_quantile"] = Field(description="How the threshold is fitted.")
    quantile: float = Field(gt=0, le=1, description="Quantile of calibration-window scores.")
    factor: float = Field(gt=0, description="Margin multiplied onto that quantile.")
    holdout: float = Field(0.0, ge=0, le=0.9, description="Fraction of the calibration samples "
                           "held out to score the threshold base out of sample; 0 = in-sample.")


class AdaptationSpec(_Strict):
    """Bounded per-channel level adaptation (:mod:`agent.pipeline.drift`): a level offset d per
    channel, in calibration sigmas, starts at 0; each window's mean features are scored against
    it; after a window scoring at most the threshold base's ``quantile`` (threshold / factor),
    d ← clip(d + ``rate`` · (window mean − d), −``bound``, ``bound``)."""

    rate: float = Field(gt=0, le=1, description="EWMA rate α per scored window.")
    bound: float = Field(gt=0, description="Largest level offset, in calibration sigmas.")


class ScoreSpec(_Strict):
    """How model outputs become a score.

    ``feature_deviation``: the model outputs F = len(features) × C window features (feature-major:
    all channels of feature 0, then feature 1, ...). On device, each feature is standardised
    against its calibration-window mean and std (std floored at ``feature_std_floor``) and the
    score is the mean of the ``top_k`` largest absolute z values.
    """

    kind: Literal["feature_deviation"] = Field(description="Score definition.")
    features: list[str] = Field(min_length=1, description="Per-channel features the model emits.")
    top_k: int = Field(ge=1, description="How many of the largest |z| are averaged.")
    feature_std_floor: list[float] = Field(description="Lower bound of each feature's std (F,).")
    threshold: ThresholdSpec
    adaptation: AdaptationSpec | None = Field(
        None, description="Bounded level adaptation of the 'mean' features (None: off; packages "
        "before skab-wstat 3 have none).")


class Artefact(_Strict):
    """One runnable file of the package."""

    runtime: Literal["onnxruntime", "openvino", "litert"] = Field(description="Runtime.")
    precision: Literal["int8", "fp32"] = Field(description="Numeric precision.")
    path: str = Field(description="Path relative to the package directory.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of the file.")
    size_bytes: int = Field(ge=1, description="File size in bytes.")
    input_range: tuple[float, float] | None = Field(
        None,
        description="INT8 artefacts: (low, high) of the model input its quantization represents "
        "without clipping; windows outside it are scored with the FP32 artefact.",
    )


class Golden(_Strict):
    """Golden vectors: scaled input windows and the FP32 model's outputs for them."""

    inputs: list[list[list[float]]] = Field(description="Shape (N, window, C), scaled inputs.")
    outputs: list[list[float]] = Field(description="Shape (N, F), expected model outputs.")
    atol: float = Field(gt=0, description="Absolute tolerance for every artefact.")


class FittedOn(_Strict):
    """Where a fitted calibration came from."""

    device_id: str = Field(description="Device whose samples were used.")
    stream: str = Field(description="That device's stream.")
    samples: int = Field(ge=2, description="Raw readings the calibration was fitted on (N).")
    data_start: float | None = Field(
        None, description="Epoch seconds UTC of the first sample used, when known."
    )
    data_end: float | None = Field(
        None, description="Epoch seconds UTC of the last sample used, when known."
    )


class FittedCalibration(_Strict):
    """A calibration fitted in the cloud on one device's uploaded samples.

    Same formulas as the on-device calibration (:mod:`cloud_sync.calibration`): the input scaler
    z = (x − mean) / scale, the calibration windows' feature mean and floored std, and the
    threshold. A package carrying it is ready to score from the first window on that device
    (no calibration period).
    """

    mean: list[float] = Field(min_length=1, description="Scaler mean per channel (C,), units.")
    scale: list[float] = Field(
        min_length=1, description="Scaler scale per channel (C,), units, > 0."
    )
    feature_mean: list[float] = Field(min_length=1, description="Feature means (F,).")
    feature_std: list[float] = Field(min_length=1, description="Floored feature stds (F,), > 0.")
    threshold: float = Field(gt=0, description="Score threshold.")
    fitted_on: FittedOn


class UnivariateSpec(_Strict):
    """How a one-channel package handles an irregular, drifting stream (docs/detection.md,
    "Univariate streams"; :mod:`agent.pipeline.univariate`).

    * gaps: an interval longer than ``gap_factor`` × the median of the recent intervals restarts
      the window (no window spans the gap);
    * scale floor: max(``scale_floor``, ``scale_floor_rel`` × |median|, the smallest nonzero
      step of the calibration samples), so a flat calibration does not turn one quantum into
      an alarm;
    * bounded drift adaptation: after each scored window whose score is below ``adapt_below``
      × threshold, the baseline level μ ← μ + ``adapt_rate`` · (window mean − μ), then clipped
      to μ_cal ± ``drift_bound`` · σ_cal;
    * ``rule_k`` of ``rule_n``: the alert rule the grouped selection chose; a stream whose
      ``[streams.rules]`` gives no rule key runs it, and so does ``benchmarks/univariate.py``
      (:func:`agent.services.stream_rules.stream_rule_params`);
    * ``rule_spike``: the rule's single-window path the selection chose (one window above
      ``rule_spike`` × threshold alerts; :class:`agent.pipeline.rules.RuleParams`
      ``spike_factor``), None = off; applied like ``rule_k``, and a stream's ``spike_factor``
      key overrides it;
    * ``threshold_sigma`` (packages from ``univariate-wstat@3``): the robust adaptive score
      (:mod:`agent.pipeline.robust`): each window feature against a baseline whose centre
      (rate ``adapt_rate``, the level bounded at ± ``drift_bound`` calibration sigmas) and
      robust scale (rate ``scale_rate``) adapt with deviations clipped at ± ``clip`` robust
      sigmas, spread, roughness and scales within a factor ``scale_bound`` of their start;
      the threshold is ``threshold_sigma`` robust sigmas and ``score.threshold`` and
      ``adapt_below`` are not read. None: the calibration-quantile threshold.
    """

    gap_factor: float = Field(gt=1, description="Gap = interval > gap_factor x median interval.")
    scale_floor_rel: float = Field(ge=0, description="Scale floor relative to |median|.")
    adapt_rate: float = Field(ge=0, lt=1, description="EWMA rate of the baseline per window.")
    adapt_below: float = Field(gt=0, le=1, description="Only windows below this x threshold "
                               "move the baseline.")
    drift_bound: float = Field(ge=0, description="Largest baseline move, in calibration sigmas.")
    calibration_fraction: float | None = Field(
        None, gt=0, lt=1, description="Not read (packages before version 2 carry it): "
        "benchmarks calibrate on the first calibration_samples rows, as a device does.")
    rule_k: int = Field(ge=1, description="Selected alert rule: k of ...")
    rule_n: int = Field(ge=1, description="... the last n windows.")
    rule_spike: float | None = Field(
        None, ge=1, description="Selected single-window path: one window above rule_spike x "
        "threshold alerts (None: off; packages before univariate-wstat 3 have none).")
    threshold_sigma: float | None = Field(
        None, gt=0, description="Robust adaptive score: threshold in robust sigmas (None: the "
        "calibration-quantile threshold of packages before univariate-wstat 3).")
    scale_rate: float = Field(0.01, ge=0, lt=1, description="Robust score: EW rate of the "
                              "robust scales per window.")
    clip: float = Field(3.0, gt=0, description="Robust score: deviations clipped at this many "
                        "robust sigmas before they adapt the baseline.")
    scale_bound: float = Field(4.0, ge=1, description="Robust score: largest factor between a "
                               "spread, roughness or scale value and its start.")


class Manifest(_Strict):
    """The whole manifest of a model package (format 1)."""

    format: Literal[1] = Field(description="Manifest format version.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="Model name.")
    version: int = Field(ge=1, description="Monotonic integer version.")
    kind: Literal["sensor"] = Field(description="Input kind.")
    description: str = Field(description="One line for operators.")
    input: InputSpec
    preprocessing: Preprocessing
    score: ScoreSpec
    artefacts: list[Artefact] = Field(min_length=1)
    golden: Golden
    latency_budget_ms_p99: float = Field(gt=0, description="p99 budget for one window, in ms.")
    lineage: dict[str, Any] = Field(description="Training data, recipe, FP32-vs-INT8 agreement.")
    calibration: FittedCalibration | None = Field(
        None,
        description="A calibration fitted in the cloud for one device (None: the device "
        "calibrates on its first readings). Optional, so format 1 stays backward-compatible.",
    )
    univariate: UnivariateSpec | None = Field(
        None, description="One-channel packages: gap handling and bounded drift adaptation "
        "(None: a multichannel package, scored as before). Optional, additive."
    )
    signature: str | None = Field(None, description="Reserved: Ed25519 signature (base64).")


class ImageInputSpec(_Strict):
    """What an image model reads: ``(B, channels, height, width)`` float32, each pixel
    ``(value / 255 - mean[c]) / std[c]`` after conversion (grayscale when ``grayscale``) and
    resizing to ``height`` x ``width`` (``resize = "area"``: OpenCV ``INTER_AREA``)."""

    height: int = Field(ge=8, description="Model input height in pixels.")
    width: int = Field(ge=8, description="Model input width in pixels.")
    channels: Literal[1, 3] = Field(description="1 = grayscale, 3 = RGB.")
    grayscale: bool = Field(description="Convert frames to grayscale before resizing.")
    resize: Literal["area", "linear"] = Field("area", description="Resize interpolation.")
    mean: list[float] = Field(min_length=1, description="Per-channel mean of value / 255.")
    std: list[float] = Field(min_length=1, description="Per-channel std of value / 255, > 0.")


class ImageThresholdSpec(_Strict):
    """``value`` = quantile ``quantile`` of the model's scores on held-out good images."""

    kind: Literal["validation_quantile"] = Field(description="How the threshold was fitted.")
    quantile: float = Field(gt=0, le=1, description="Quantile of validation-good scores.")
    value: float = Field(gt=0, description="The threshold, in score units.")


class ImageScoreSpec(_Strict):
    """``model_score``: the model's own output ``(B,)`` is the anomaly score (larger = more
    anomalous); ``aggregation`` names how the model reduces its map to one number."""

    kind: Literal["model_score"] = Field(description="Score definition.")
    aggregation: str = Field(description="E.g. 'max_cell_mahalanobis'.")
    grid: list[int] = Field(min_length=2, max_length=2, description="Score map cells (rows, cols).")
    threshold: ImageThresholdSpec


class ImageGolden(_Strict):
    """Golden images: preprocessed inputs in a ``.npy`` file of the package, ``(N, C, H, W)``
    float32, and the FP32 model's scores ``(N,)``."""

    inputs_file: str = Field(description="Path of the .npy file, relative to the package.")
    inputs_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of it.")
    outputs: list[float] = Field(min_length=1, description="Expected scores (N,).")
    atol: float = Field(gt=0, description="Absolute tolerance for every artefact.")


class ImageManifest(_Strict):
    """The manifest of an image model package (format 1, ``kind = "image"``).

    A class of its own rather than optional fields on :class:`Manifest`, so that sensor code
    keeps its precise types; :func:`parse_manifest` picks the class by ``kind``.
    """

    format: Literal[1] = Field(description="Manifest format version.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="Model name.")
    version: int = Field(ge=1, description="Monotonic integer version.")
    kind: Literal["image"] = Field(description="Input kind.")
    description: str = Field(description="One line for operators.")
    input: ImageInputSpec
    score: ImageScoreSpec
    artefacts: list[Artefact] = Field(min_length=1)
    golden: ImageGolden
    latency_budget_ms_p99: float = Field(gt=0, description="p99 budget for one image, in ms.")
    lineage: dict[str, Any] = Field(description="Training data, recipe, FP32-vs-INT8 agreement.")
    signature: str | None = Field(None, description="Reserved: Ed25519 signature (base64).")


#: Kinds of model package.
ManifestKind = Literal["sensor", "image"]

AnyManifest = Annotated[Manifest | ImageManifest, Field(discriminator="kind")]
_ANY: TypeAdapter[Manifest | ImageManifest] = TypeAdapter(AnyManifest)


def parse_manifest(obj: object) -> Manifest | ImageManifest:
    """Validate a manifest of either kind (``kind`` picks :class:`Manifest` or
    :class:`ImageManifest`).

    Raises:
        pydantic.ValidationError: The object matches neither.
    """
    return _ANY.validate_python(obj)


def canonical_bytes(manifest: dict[str, Any]) -> bytes:
    """Canonical JSON bytes of ``manifest`` without its ``signature`` key (what gets signed).

    >>> canonical_bytes({"b": 1, "a": "é", "signature": "x"})
    b'{"a":"\\xc3\\xa9","b":1}'
    """
    body = {k: v for k, v in manifest.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
