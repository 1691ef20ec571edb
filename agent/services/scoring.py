"""Scoring one block of a sensor stream's readings and reporting what came out of it.

The pipeline (main) thread hands a stream's queued readings to :meth:`BlockScorer.process`:
the model slot syncs a model update in between two blocks, :meth:`agent.pipeline.stream.
StreamPipeline.process_block` scores them, and the result is reported: clock steps and the end
of calibration (logged, counted, the calibration stored for the next start), retraining samples
(:mod:`agent.services.samples`), the stream's gauges and state, its episode events and
aggregates (:mod:`agent.services.alerting`), and a univariate stream's adapted baseline
(:mod:`agent.services.baselines`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import numpy as np

from agent.logs import ALWAYS
from agent.metrics import Metrics
from agent.records import iso_utc
from agent.sensor_streams import SensorStream, save_calibration
from agent.services.alerting import Alerting
from agent.services.baselines import BaselineSaver
from agent.services.samples import SampleCollector, SampleUploader
from agent.services.stream_feed import StateFeed
from agent.store.sqlite import Store

log = logging.getLogger("agent")


class BlockScorer:
    """Scores blocks of the sensor streams' readings (pipeline thread only).

    Args:
        metrics: Per-stream counters, gauges and histograms.
        feed: The state board's feed (last score, threshold, model).
        alerting: Stores the events and aggregates.
        store: Holds the calibrations.
        clock: Wall clock, epoch seconds UTC.
        collectors: Retraining sample collectors by stream (may be empty; read per block).
        samples: Their uploader (told when a calibration block is ready), or None.
        baselines: Saves the univariate streams' adapted baselines after their blocks, or
            None.
    """

    def __init__(
        self,
        metrics: Metrics,
        feed: StateFeed,
        alerting: Alerting,
        store: Store,
        clock: Callable[[], float],
        collectors: Mapping[str, SampleCollector],
        samples: SampleUploader | None,
        baselines: BaselineSaver | None = None,
    ) -> None:
        self.metrics = metrics
        self.feed = feed
        self.alerting = alerting
        self.store = store
        self.clock = clock
        self.collectors = collectors
        self.samples = samples
        self.baselines = baselines

    def process(self, s: SensorStream) -> None:
        """Score the stream's pending readings (``s.pending``, emptied) as one block: model
        updates handed over between two blocks, clock steps and calibration logged and
        counted, events raised (before the rest), retraining samples collected, gauges set,
        aggregates stored."""
        readings, s.pending = s.pending, []
        values = np.stack([r.values for r in readings])[:, s.order]
        ts = np.fromiter((r.ts for r in readings), dtype=np.float64, count=len(readings))
        mono = readings[-1].received_mono
        received = np.fromiter((r.received_mono for r in readings), dtype=np.float64,
                               count=len(readings))
        was_calibrating = s.pipeline.calibrating
        if s.slot is not None:  # model updates happen here, between two blocks
            s.package = s.slot.sync(s.pipeline)
        out = s.pipeline.process_block(values, ts, mono, received)
        if s.slot is not None:  # a new model that failed at run time was swapped back
            s.package = s.slot.sync(s.pipeline)
        name = s.config.name
        for step in out.clock_steps:
            self.metrics.clock_steps_total.labels(stream=name, direction=step.direction).inc()
            log.warning("stream %s: timestamps stepped %s by %.1f s at %s (wall clock set by NTP "
                        "or a missing RTC, or a gap in the input); the open aggregate interval "
                        "was closed and alert cooldowns count monotonic time across the step",
                        name, step.direction, abs(step.size_s), iso_utc(step.at_ts),
                        extra={**ALWAYS, "stream": name})
        if was_calibrating and out.calibrated is not None:
            self.metrics.calibrating.labels(stream=name).set(0)
            self.metrics.threshold.labels(stream=name).set(out.calibrated.threshold)
            fitted = s.pipeline.calibration_samples
            log.info("stream %s: calibrated on %d readings, threshold %.3f", name,
                     s.pipeline.spec.calibration_samples if fitted is None else len(fitted),
                     out.calibrated.threshold, extra={"stream": name})
            if out.calibration_outliers:
                self.metrics.calibration_outliers_total.labels(stream=name).inc(
                    out.calibration_outliers)
                log.warning("stream %s: %d far-out reading(s) left out of the calibration",
                            name, out.calibration_outliers, extra=ALWAYS)
            save_calibration(self.store, s, s.package, self.clock)
        # Alerts first: their latency (read -> delivered) does not wait for the bookkeeping
        # below (retraining samples, counters, the state board).
        for event in out.events:
            self.alerting.raise_event(s, event)
        collector = self.collectors.get(name)
        if collector is not None:  # retraining samples: calibration block, normal windows
            if out.calibrated is not None and s.pipeline.calibration_samples is not None:
                collector.add_calibration(s.pipeline.calibration_samples)
                if self.samples is not None:
                    self.samples.notify()
            collector.observe(values, out.end_index, out.scores, out.threshold)
        if out.nonfinite_scores:
            self.metrics.nonfinite_scores_total.labels(stream=name).inc(out.nonfinite_scores)
            log.warning("stream %s: %d window(s) scored non-finite (a reading the model cannot "
                        "represent); scored off-scale", name, out.nonfinite_scores,
                        extra={"stream": name})
        n_scored = int(np.count_nonzero(~np.isnan(out.scores)))
        if n_scored:
            self.metrics.windows_total.labels(stream=name).inc(n_scored)
            if mono:
                self.metrics.read_to_score_seconds.labels(stream=name).observe(
                    time.monotonic() - mono
                )
        finite = out.scores[np.isfinite(out.scores)]
        m = s.package.manifest
        self.feed.scored(name, float(finite[-1]) if finite.size else None, out.threshold,
                         model_name=m.name, model_version=m.version,
                         skipping=s.pipeline.windower.hop > s.pipeline.spec.hop)
        for agg in out.aggregates:
            self.alerting.write_aggregate(agg)
        if self.baselines is not None:
            self.baselines.after_block(s.pipeline, s.package)
