"""The adapted baselines of univariate streams, saved while the agent runs and resumed at start.

A univariate stream with the robust score (:mod:`agent.pipeline.robust`) follows a change of its
normal level and noise within bounds. Without keeping that baseline, every restart (a systemd
restart, an upgrade, a reboot) would start again from the calibration's baseline and alert
again on a level shift the stream had long followed. So:

* :class:`BaselineSaver` (pipeline thread) writes each stream's baseline to the store
  (:mod:`agent.store.baselines`) after a block that moved it, at most every
  :data:`SAVE_INTERVAL_S` seconds, without an fsync of its own, and once more at shutdown and
  reload (fsynced): a crash loses at most that interval of adaptation.
* :func:`restore_baseline` (at start, when the stream is built) resumes the stored baseline when
  it belongs to the same model package (name, version, manifest sha256), detector settings and
  calibration (:mod:`agent.pipeline.baseline_restore`). A baseline of another package or
  calibration is discarded with one INFO line; a row that is not a valid baseline (wrong shape,
  a value that is not a finite number, beyond the drift bound) with one WARNING line. Either way
  the row is deleted and the stream starts from its calibration's baseline.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from agent.errors import StoreError
from agent.inference.package import ModelPackage
from agent.pipeline.baseline_restore import StoredBaseline, calibration_sha256, stale
from agent.pipeline.restore import CalibrationKey, calibration_key
from agent.pipeline.robust import RobustState, resume_state
from agent.pipeline.stream import StreamPipeline
from agent.pipeline.univariate import UnivariatePipeline
from agent.records import iso_utc
from agent.store.sqlite import Store

log = logging.getLogger("agent")

#: Least seconds (monotonic) between two saves of one stream's baseline while running.
SAVE_INTERVAL_S = 60.0


def _forget(store: Store, stream: str) -> None:
    with contextlib.suppress(StoreError):  # counted by the store; refused again next start
        store.forget_baseline(stream)


def restore_baseline(store: Store, pipeline: StreamPipeline, key: CalibrationKey) -> bool:
    """Resume the stored adapted baseline of ``pipeline``'s stream when it belongs to it (see the
    module docstring); True when resumed.

    Args:
        store: Holds the stored baselines.
        pipeline: The stream's pipeline, built with the calibration it starts from (None:
            calibrating).
        key: The calibration key of the stream's model and detector settings now.
    """
    name = pipeline.stream
    try:
        stored = store.baseline(name)
    except StoreError as exc:
        log.warning("stream %s: stored baseline refused (%s); starting from the calibration's "
                    "baseline", name, exc)
        _forget(store, name)
        return False
    if stored is None:
        return False
    start = pipeline.baseline_start() if isinstance(pipeline, UnivariatePipeline) else None
    params = pipeline.robust_params if isinstance(pipeline, UnivariatePipeline) else None
    why = stale(stored, key, pipeline.calibration)
    if why is None and (start is None or params is None):
        why = "the model has no adaptive baseline"
    if why is not None:
        log.info("stream %s: stored baseline discarded (%s); starting from the calibration's "
                 "baseline", name, why)
        _forget(store, name)
        return False
    assert isinstance(pipeline, UnivariatePipeline) and start is not None and params is not None
    try:
        state = resume_state(start, stored.centre, stored.scale, params)
    except ValueError as exc:
        log.warning("stream %s: stored baseline refused (%s); starting from the calibration's "
                    "baseline", name, exc)
        _forget(store, name)
        return False
    pipeline.resume_baseline(state)
    cal = pipeline.calibration
    assert cal is not None
    mu, sigma = float(cal.scaler.mean[0]), float(cal.scaler.scale[0])
    log.info("stream %s: adapted baseline restored (saved %s, level %.6g, calibration level "
             "%.6g)", name, iso_utc(stored.saved_at), mu + sigma * float(state.centre[0]), mu)
    return True


class BaselineSaver:
    """Saves the univariate streams' adapted baselines (pipeline thread only).

    Args:
        store: Where they are kept.
        clock: Wall clock, epoch seconds UTC (``saved_at``).
        monotonic: Monotonic clock, seconds (the save interval).
        interval_s: Least seconds between two saves of one stream while running.
    """

    def __init__(self, store: Store, clock: Callable[[], float],
                 monotonic: Callable[[], float] = time.monotonic,
                 interval_s: float = SAVE_INTERVAL_S) -> None:
        self.store = store
        self.clock = clock
        self.monotonic = monotonic
        self.interval_s = interval_s
        # per stream: when it was last saved or tried (monotonic) and the state saved
        self._saved: dict[str, tuple[float, RobustState | None]] = {}
        self._failing: set[str] = set()

    def after_block(self, pipeline: StreamPipeline, package: ModelPackage) -> None:
        """Save the stream's baseline if it moved and the last save is ``interval_s`` old."""
        last = self._saved.get(pipeline.stream)
        if last is not None and self.monotonic() - last[0] < self.interval_s:
            return
        self.save(pipeline, package)

    def save(self, pipeline: StreamPipeline, package: ModelPackage, *,
             durable: bool = False) -> bool:
        """Save the stream's baseline now unless it is unchanged since the last save; True when
        written. A failed write is logged (WARNING once until a save succeeds again)."""
        if not isinstance(pipeline, UnivariatePipeline):
            return False
        state, cal = pipeline.robust_state, pipeline.calibration
        name = pipeline.stream
        last = self._saved.get(name)
        if state is None or cal is None or (last is not None and last[1] is state):
            return False
        det = pipeline.detector
        rec = StoredBaseline(name, calibration_key(package.manifest, det.spec,
                                                   det.backend.precision),
                             calibration_sha256(cal), state.centre, state.scale, self.clock())
        try:
            self.store.save_baseline(rec, durable=durable)
        except StoreError as exc:
            self._saved[name] = (self.monotonic(), None if last is None else last[1])
            if name not in self._failing:
                self._failing.add(name)
                log.warning("stream %s: adapted baseline not stored (a restart now starts "
                            "from the calibration's baseline): %s", name, exc)
            return False
        self._failing.discard(name)
        self._saved[name] = (self.monotonic(), state)
        return True

    def save_all(self, streams: Iterable[tuple[StreamPipeline, ModelPackage]]) -> None:
        """Save every stream's baseline, fsynced (shutdown and reload)."""
        for pipeline, package in streams:
            self.save(pipeline, package, durable=True)
