"""IMS bearing run-to-failure (test 2) through the agent's own detector and alert rules.

    python benchmarks/ims.py --data ../shared/datasets/ims_bearing [--model models/skab-wstat]

Protocol (the dataset README's informal one, after Flovik): fit on the healthy rows
2004-02-12 11:02:39 … 2004-02-13 23:52:39 of ``bingblackbean/2nd_test_resmaple_10minutes.csv``
(one row per 1-s snapshot taken every 10 min: mean |acceleration| of bearings 1-4), score
everything after them. Bearing 1 fails (outer race) at the end of the run, 2004-02-19.

What runs: the window-statistics detector with the SKAB package's selected defaults (window,
top_k, threshold quantile, factor and hold-out; read from ``--model``'s manifest, so the defaults
chosen on SKAB are tested on a different machine), as a 4-channel INT8 ONNX model built here
from the healthy rows (:func:`fleet.training.wstat.build_graph`, quantized with
:func:`fleet.training.wstat.quantize_int8` on the healthy windows amplified ×4, the fleet's
headroom for faults), then the agent's :class:`agent.pipeline.stream.StreamPipeline` and
:class:`agent.pipeline.rules.AlertRules` with their default rule parameters (k of n, hysteresis,
cooldown). Scale and feature floors are f × the healthy rows' std, f the SKAB package's floor
fraction (its recipe's ``floor_frac``, chosen by the grouped selection; 0.1 when not recorded).

Printed: every alert (time, score, threshold), the alerts inside the healthy rows when they are
re-scored with the fitted calibration (in-sample: those rows fitted the threshold, so this count
can hardly be other than 0), per time split (fit on the first 50 % / 75 % of the healthy rows
only, score everything after: ``time_split=… fit_rows=… healthy_alarms_after_fit=…
first_alarm_after_healthy=…``, the healthy-part check that can fail), and last
``first_alarm=<ISO time> healthy_alarms=<n>``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.inference.package import load_package  # noqa: E402
from agent.inference.registry import build_backend  # noqa: E402
from agent.pipeline.detector import DetectorSpec, FeatureDeviationDetector  # noqa: E402
from agent.pipeline.drift import LevelAdaptation  # noqa: E402
from agent.pipeline.rules import RuleParams  # noqa: E402
from agent.pipeline.stream import StreamPipeline  # noqa: E402
from cloud_sync.calibration import FEATURES, sliding_windows, window_features  # noqa: E402
from fleet.training.wstat import build_graph, quantize_int8  # noqa: E402

FILE = Path("bingblackbean") / "2nd_test_resmaple_10minutes.csv"
FIT_FROM = dt.datetime(2004, 2, 12, 11, 2, 39, tzinfo=dt.timezone.utc)
FIT_TO = dt.datetime(2004, 2, 13, 23, 52, 39, tzinfo=dt.timezone.utc)
HEADROOM = 4.0


def read(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Epoch seconds ``(T,)``, values ``(T, 4)`` and channel names of the test-2 CSV."""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    channels = rows[0][2:]
    ts = np.array([dt.datetime.strptime(r[1], "%Y.%m.%d.%H.%M.%S").replace(tzinfo=dt.timezone.utc)
                   .timestamp() for r in rows[1:]])
    return ts, np.array([[float(v) for v in r[2:]] for r in rows[1:]]), channels


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def build_model(healthy: np.ndarray, window: int, floor: np.ndarray, work: Path) -> Path:
    """The 4-channel INT8 window-statistics model, quantized on the scaled healthy windows
    (and the same ×``HEADROOM``)."""
    z = ((healthy - healthy.mean(0)) / np.maximum(healthy.std(0), floor)).astype(np.float32)
    win = sliding_windows(z, window)
    import onnx  # noqa: PLC0415

    work.mkdir(parents=True, exist_ok=True)
    fp32, int8 = work / "model.fp32.onnx", work / "model.int8.onnx"
    onnx.save(build_graph(window, healthy.shape[1]), fp32)
    quantize_int8(fp32, int8, np.concatenate([win, win * HEADROOM]), method="minmax",
                  percentile=99.99, op_types=["MatMul", "Sub", "Abs"])
    return int8


def fitted_detector(fit_rows: np.ndarray, base: DetectorSpec, frac: float,
                    channels: list[str], work: Path,
                    adaptation: LevelAdaptation | None = None) -> FeatureDeviationDetector:
    """The detector fitted on ``fit_rows`` ``(N, 4)``: floors ``frac`` × their std, the INT8
    model built on them, the SKAB package's score and threshold rule and its level
    ``adaptation`` (None: none)."""
    w = base.window
    floor = frac * fit_rows.std(0)
    feats = window_features(((sliding_windows(fit_rows, w) - fit_rows.mean(0))
                             / np.maximum(fit_rows.std(0), floor)).astype(np.float32))
    spec = DetectorSpec(
        channels=tuple(channels), window=w, hop=1, calibration_samples=fit_rows.shape[0],
        scale_floor=floor, n_features=len(FEATURES), top_k=base.top_k,
        feature_std_floor=frac * feats.astype(np.float64).std(0),
        threshold_quantile=base.threshold_quantile, threshold_factor=base.threshold_factor,
        threshold_holdout=base.threshold_holdout)
    backend = build_backend("onnxruntime", build_model(fit_rows, w, floor, work), "int8")
    return FeatureDeviationDetector(spec, backend, adaptation=adaptation)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="IMS bearing test 2 through the agent's detector")
    ap.add_argument("--data", type=Path, required=True, help="IMS dataset root")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "skab-wstat",
                    help="package whose detector defaults are used")
    args = ap.parse_args(argv)
    ts, values, channels = read(args.data / FILE)
    fit = (ts >= FIT_FROM.timestamp()) & (ts <= FIT_TO.timestamp())
    start, stop = int(np.argmax(fit)), int(len(fit) - np.argmax(fit[::-1]))
    healthy = values[start:stop]
    package = load_package(args.model)
    base = package.detector_spec()
    frac = float(((package.manifest.lineage or {}).get("args") or {}).get("floor_frac", 0.1))
    print(f"{args.data / FILE}: {len(ts)} rows; fit on rows {start}..{stop - 1} "
          f"({iso(ts[start])} .. {iso(ts[stop - 1])}); detector defaults of {args.model.name}: "
          f"W={base.window} top_k={base.top_k} q={base.threshold_quantile} "
          f"factor={base.threshold_factor} holdout={base.threshold_holdout} floor={frac:g} "
          f"adaptation={package.adaptation()}; "
          f"rules {RuleParams()}")
    with tempfile.TemporaryDirectory(prefix="ims-") as tmp:
        adaptation = package.adaptation()
        detector = fitted_detector(healthy, base, frac, channels, Path(tmp) / "all", adaptation)
        spec = detector.spec
        cal = detector.calibrate(healthy)
        print(f"threshold {cal.threshold:.3f}")
        # the healthy rows re-scored with the fitted calibration (in-sample: these rows fitted
        # the threshold, so this count can hardly be other than 0; the time split below is the
        # check that can fail)
        healthy_pipe = StreamPipeline("ims", "bench", spec, detector, RuleParams(),
                                      calibration=cal)
        healthy_alerts = healthy_pipe.process_block(healthy, ts[start:stop]).alerts
        # the run: calibrate on the healthy rows, score every row after them
        pipe = StreamPipeline("ims", "bench", spec, detector, RuleParams())
        alerts = pipe.process_block(values[start:], ts[start:]).alerts
        splits = [time_split(values, ts, start, stop, share, base, frac, channels,
                             Path(tmp) / f"split{share}", adaptation) for share in SPLITS]
    for a in healthy_alerts:
        print(f"healthy-part alarm {iso(a.window_end)} score {a.score:.2f}")
    for a in alerts:
        print(f"alarm {iso(a.window_end)} score {a.score:.2f} > {a.threshold:.2f}")
    for line in splits:
        print(line)
    first = iso(alerts[0].window_end) if alerts else "none"
    print(f"first_alarm={first} healthy_alarms={len(healthy_alerts)}")
    return 0


#: Time splits of the healthy part: fit on this share of its rows, count alarms in the rest.
SPLITS = (0.5, 0.75)


def time_split(values: np.ndarray, ts: np.ndarray, start: int, stop: int, share: float,
               base: DetectorSpec, frac: float, channels: list[str], work: Path,
               adaptation: LevelAdaptation | None = None) -> str:
    """Fit on the first ``share`` of the healthy rows ``start..stop-1`` only, score everything
    after them: the alerts raised before ``stop`` are false alarms on healthy rows the fit has
    not seen. Returns the line ``time_split=<share> fit_rows=<n> healthy_alarms_after_fit=<n>
    first_alarm_after_healthy=<ISO|none>``."""
    cut = start + round(share * (stop - start))
    detector = fitted_detector(values[start:cut], base, frac, channels, work, adaptation)
    pipe = StreamPipeline("ims", "bench", detector.spec, detector, RuleParams())
    alerts = pipe.process_block(values[start:], ts[start:]).alerts
    healthy = [a for a in alerts if a.window_end <= ts[stop - 1]]
    later = [a for a in alerts if a.window_end > ts[stop - 1]]
    first = iso(later[0].window_end) if later else "none"
    return (f"time_split={share:g} fit_rows={cut - start} healthy_alarms_after_fit="
            f"{len(healthy)} first_alarm_after_healthy={first}")


if __name__ == "__main__":
    raise SystemExit(main())
