"""Univariate streams through the agent's own pipeline: score CSV files of ``timestamp,value``.

    python benchmarks/univariate.py --data DIR --out OUT [--model models/univariate-wstat]

Every ``*.csv`` under DIR (recursively) with a header holding ``timestamp`` and ``value``
(timestamps ISO 8601, e.g. ``2014-04-01 00:00:00``, naive = UTC, or epoch seconds) is run in
stream order, ``--block`` rows at a time, through the univariate package: the agent's
:class:`agent.pipeline.univariate.UnivariatePipeline` (a :class:`StreamPipeline`: windows,
calibration, detector, gaps, bounded drift adaptation) and :class:`agent.pipeline.rules.AlertRules`
with the rule a deployed stream whose ``[streams.rules]`` gives no key runs
(:func:`agent.services.stream_rules.stream_rule_params`: the package's selected k of n, the
agent's defaults for the other rule parameters). No labels are read. ``OUT/<same relative
path>`` gets ``timestamp,value,score,alarm,in_alarm``:

* ``score``: the score of the window ending at the row; **empty** while calibrating, before the
  first window after a gap is complete, and on rejected rows;
* ``alarm``: 1 on the row where the alert rules raise an alert, else 0;
* ``in_alarm``: 1 on a scored row after which an alert episode is open (the rules' state at the
  end of the row's ``--block``: exact at the default of one row per block), else 0;
* rejected rows (value or timestamp not a number, timestamp before the previous row's) are
  kept as they were with an empty score and alarm 0;
* calibration: the first N accepted rows, N the package's ``calibration_samples``, as on a
  device (which cannot know how long its stream will be). A file with fewer than N + W accepted
  rows is written unscored (all scores empty).

The last line printed is ``files=… rows=… rejected=… unscored_files=… alarms=… in_alarm=…``
(``in_alarm``: the share of scored rows inside an open episode).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.config.schema import RulesConfig  # noqa: E402
from agent.inference.base import Backend  # noqa: E402
from agent.inference.package import (  # noqa: E402
    ModelPackage,
    load_package,
    open_backend,
    saturation_fallback,
)
from agent.pipeline.detector import DetectorSpec  # noqa: E402
from agent.pipeline.rules import RuleParams  # noqa: E402
from agent.pipeline.univariate import UnivariatePipeline, accepted_rows  # noqa: E402
from agent.pipeline.univariate_detector import UnivariateDetector, UnivariateParams  # noqa: E402
from agent.services.stream_rules import stream_rule_params  # noqa: E402

DEFAULT_MODEL = ROOT / "models" / "univariate-wstat"


def parse_ts(text: str) -> float:
    """Epoch seconds of an ISO 8601 time (naive = UTC) or of an epoch number; NaN if neither.

    >>> parse_ts("2014-04-01 00:00:00"), parse_ts("1396310400"), parse_ts("x")
    (1396310400.0, 1396310400.0, nan)
    """
    s = text.strip()
    try:
        v = float(s)
        return v if math.isfinite(v) else math.nan
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return math.nan
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


#: The largest finite float32: the agent rejects readings beyond it (out_of_range).
FLOAT32_MAX = float(np.finfo(np.float32).max)


def parse_value(text: str) -> float:
    """The float of ``text``; NaN (rejected, as the agent rejects it) when it is not a finite
    number a float32 holds."""
    try:
        v = float(text)
    except ValueError:
        return math.nan
    return v if math.isfinite(v) and abs(v) <= FLOAT32_MAX else math.nan


def read_csv(path: Path) -> tuple[list[list[str]], np.ndarray, np.ndarray]:
    """Rows ``[timestamp, value]`` as text, epoch seconds ``(T,)`` and values ``(T,)`` (NaN
    where a field does not parse).

    Raises:
        ValueError: no header with ``timestamp`` and ``value`` columns.
    """
    with path.open(newline="", encoding="utf-8-sig", errors="replace") as fh:  # BOM or not
        rows = list(csv.reader(fh))
    header = [h.strip().lower() for h in rows[0]] if rows else []
    if "timestamp" not in header or "value" not in header:
        raise ValueError(f"{path}: header must hold 'timestamp' and 'value', got {rows[:1]}")
    it, iv = header.index("timestamp"), header.index("value")
    out = [[r[it] if len(r) > it else "", r[iv] if len(r) > iv else ""] for r in rows[1:]
           if any(c.strip() for c in r)]
    return (out, np.array([parse_ts(r[0]) for r in out], np.float64),
            np.array([parse_value(r[1]) for r in out], np.float64))


def score_series(ts: np.ndarray, values: np.ndarray, spec: DetectorSpec, backend: Backend,
                 rules: RuleParams, params: UnivariateParams, block: int = 1,
                 fallback: tuple[Backend | None, tuple[float, float] | None] = (None, None),
                 in_alarm: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Run one series through the univariate pipeline in stream order.

    Args:
        ts, values: ``(T,)`` epoch seconds and values (NaN = unparsable, rejected).
        spec: Detector spec (its ``calibration_samples`` is the series' calibration length).
        block: Rows per ``process_block`` call.
        in_alarm: ``(T,)`` int8, filled with 1 on the scored rows after whose block an alert
            episode is open (None: not recorded).

    Returns:
        (scores ``(T,)`` float64, NaN where unscored; alarms ``(T,)`` int8; the threshold,
        NaN if the series never finished calibrating).
    """
    det = UnivariateDetector(spec, backend, params, fallback=fallback[0],
                             input_range=fallback[1])
    pipe = UnivariatePipeline("bench", "bench", spec, det, rules, params)
    scores = np.full(ts.shape[0], math.nan)
    alarms = np.zeros(ts.shape[0], np.int8)
    for a in range(0, ts.shape[0], block):
        out = pipe.process_block(values[a : a + block, None], ts[a : a + block])
        idx = out.end_index + a
        scores[idx] = out.scores
        if in_alarm is not None:
            in_alarm[idx] = pipe.rules.active
        for alert in out.alerts:  # the row whose window raised it: its end time and score
            hit = idx[(ts[idx] == alert.window_end) & (out.scores == alert.score)]
            alarms[int(hit[-1]) if hit.size else a + min(block, ts.shape[0] - a) - 1] = 1
    return scores, alarms, pipe.threshold


def run_file(path: Path, out: Path, package: ModelPackage, backend: Backend,
             fallback: tuple[Backend | None, tuple[float, float] | None], block: int
             ) -> tuple[int, int, int, bool, int, int]:
    """Score one file into ``out``; returns (rows, rejected, alarms, scored, scored rows, rows
    in alarm)."""
    rows, ts, values = read_csv(path)
    spec = package.detector_spec()
    params = package.univariate_params()
    if params is None:
        raise SystemExit(f"{package.label} is not a univariate package")
    good = accepted_rows(values[:, None], ts)
    scores = np.full(len(rows), math.nan)
    alarms = np.zeros(len(rows), np.int8)
    in_alarm = np.zeros(len(rows), np.int8)
    scored = int(good.sum()) >= spec.calibration_samples + spec.window
    if scored:
        rules = stream_rule_params(RulesConfig(), package.manifest.univariate)
        scores, alarms, _ = score_series(ts, values, spec, backend, rules, params, block,
                                         fallback, in_alarm)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["timestamp", "value", "score", "alarm", "in_alarm"])
        for r, s, al, op in zip(rows, scores.tolist(), alarms.tolist(), in_alarm.tolist(),
                                strict=True):
            w.writerow([r[0], r[1], "" if math.isnan(s) else f"{s:.6g}", al, op])
    return (len(rows), int((~good).sum()), int(alarms.sum()), scored,
            int((~np.isnan(scores)).sum()), int(in_alarm.sum()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="univariate CSV files through the agent pipeline")
    ap.add_argument("--data", type=Path, required=True, help="folder of timestamp,value CSVs")
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--precision", choices=("int8", "fp32"), default="int8")
    ap.add_argument("--block", type=int, default=1, help="rows per process_block call")
    args = ap.parse_args(argv)
    package = load_package(args.model)
    backend = open_backend(package, args.precision)
    fallback = saturation_fallback(package, package.artefact("onnxruntime", args.precision))
    files = sorted(p for p in args.data.rglob("*.csv") if p.is_file())
    totals = np.zeros(6, np.int64)
    for path in files:
        rel = path.relative_to(args.data)
        try:
            rows, rejected, alarms, scored, n_scored, n_open = run_file(
                path, args.out / rel, package, backend, fallback, max(1, args.block))
        except ValueError as exc:
            print(f"{rel}: skipped: {exc}")
            continue
        totals += (rows, rejected, alarms, 0 if scored else 1, n_scored, n_open)
        print(f"{rel}: rows={rows} rejected={rejected} alarms={alarms}"
              f"{'' if scored else ' (too short to calibrate: unscored)'}")
    print(f"files={len(files)} rows={totals[0]} rejected={totals[1]} unscored_files={totals[3]} "
          f"alarms={totals[2]} in_alarm={totals[5] / max(1, totals[4]):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
