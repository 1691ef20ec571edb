"""Retraining samples for the fleet (``[samples]``): calibration block and normal-window reservoir.

Per stream a :class:`SampleCollector` keeps

* the stream's calibration samples: the first N raw readings the pipeline calibrated on, shape
  ``(N, C)``, sent once as a ``kind="calibration"`` :class:`~cloud_sync.protocol.SampleBatch`
  (one block, ``(1, N, C)``); the fleet may retrain this device's model from them
  (``edge-fleet serve --auto-retrain``);
* a uniform random sample of at most ``reservoir_size`` raw windows the detector classified normal
  (score ≤ threshold) that start after the calibration rows (a window ending just after calibration
  holds up to W − 1 calibration rows, which the fleet also fits on), by Algorithm R (J. S. Vitter,
  "Random sampling with a reservoir", ACM Transactions on Mathematical Software 11(1), 1985): the
  t-th window seen replaces a random slot with probability ``size / t``. Each upload sends the
  reservoir and starts a new one, so every batch is a uniform sample of the normal windows since the
  previous upload.

Every batch is tagged with the model name/version in force and the stream's config hash, so the
fleet can tell what produced the classification. A single thread (``fleet-samples``) uploads with
:meth:`cloud_sync.client.FleetClient.post_samples`: right after a calibration (:meth:`
SampleUploader.notify`) and every ``upload_interval_s``. A failed upload keeps the batch for the
next attempt (the calibration block until it is stored; a reservoir snapshot is merged back);
failures are logged once per outage.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
from pydantic import Field

from agent.config.base import StrictModel
from agent.records import FloatArray
from cloud_sync.errors import FleetError
from cloud_sync.protocol import ModelRef, SampleBatch

KIND = "samples"

log = logging.getLogger("agent.samples")


class SamplesConfig(StrictModel):
    """Config of the retraining samples (``[samples]``; needs ``[fleet]`` enabled)."""

    enabled: bool = Field(
        False, description="Keep calibration samples and a reservoir of normal windows per "
        "stream and upload them to the fleet for retraining.",
    )
    reservoir_size: int = Field(
        500, ge=1, le=10_000, description="Normal windows kept per stream between uploads."
    )
    upload_interval_s: float = Field(
        3600.0, gt=0.0, description="Seconds between reservoir uploads (a calibration is "
        "uploaded as soon as it is done).",
    )


class Reservoir:
    """Algorithm R (Vitter, 1985): a uniform sample of at most ``size`` items of a stream.

    >>> r = Reservoir(2, random.Random(0))
    >>> for i in range(10):
    ...     r.offer(np.full((1, 1), float(i)))
    >>> r.seen, len(r.items)
    (10, 2)
    """

    def __init__(self, size: int, rng: random.Random) -> None:
        if size < 1:
            raise ValueError("reservoir size must be at least 1")
        self.size = size
        self.rng = rng
        self.items: list[FloatArray] = []
        self.seen = 0

    def offer(self, item: FloatArray) -> None:
        """See one item (kept with probability ``size / seen``)."""
        self.seen += 1
        if len(self.items) < self.size:
            self.items.append(item)
            return
        j = self.rng.randrange(self.seen)
        if j < self.size:
            self.items[j] = item


def config_hash(*parts: str) -> str:
    """First 16 hex digits of sha256 over the parts (stream config JSON, model label)."""
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]


class SampleCollector:
    """One stream's samples (pipeline thread adds; the uploader thread takes).

    Args:
        device_id: This device.
        stream: Stream name.
        channels: Model channel order (the last axis of every array).
        window: W, samples per window.
        sample_rate_hz: Nominal rate, reported with the samples.
        model: ``(name, version)`` in force (:meth:`set_model` changes it).
        config_hash: Hash of the stream's config.
        reservoir_size: Normal windows kept between uploads.
        rng: Random source of the reservoir.
    """

    def __init__(
        self, device_id: str, stream: str, channels: tuple[str, ...], window: int,
        sample_rate_hz: float | None, model: tuple[str, int], config_hash: str,
        reservoir_size: int, rng: random.Random | None = None,
    ) -> None:
        self.device_id, self.stream, self.channels = device_id, stream, channels
        self.window, self.sample_rate_hz = window, sample_rate_hz
        self.model, self.config_hash = model, config_hash
        self._rng = rng or random.Random()
        self._size = reservoir_size
        self._reservoir = Reservoir(reservoir_size, self._rng)
        self._tail = np.zeros((0, len(channels)))
        self._calibration: FloatArray | None = None
        # rows passed to observe so far, and the first row a reservoir window may start at
        # (the first scored row after the latest calibration; None until that row is seen)
        self._rows = 0
        self._clear_from: int | None = 0
        self._lock = threading.Lock()

    def set_model(self, name: str, version: int) -> None:
        """The model in force changed (a model update)."""
        with self._lock:
            self.model = (name, version)

    def add_calibration(self, samples: FloatArray) -> None:
        """The pipeline calibrated on ``samples`` ``(N, C)``: queue them for upload. Call it
        before :meth:`observe` of the block in which the calibration completed: windows that
        start before the first scored row after it are then kept out of the reservoir."""
        with self._lock:
            self._calibration = np.array(samples, dtype=np.float64)
            self._clear_from = None

    def observe(self, values: FloatArray, end_index: np.ndarray, scores: FloatArray,
                threshold: float) -> None:
        """See one processed block: offer its normal windows to the reservoir, except those
        that start before the first scored row after the latest calibration (the pipeline
        scores a window once its last row is past the calibration rows, so that row bounds
        them).

        Args:
            values: Shape ``(N, C)``, the block's readings in model channel order.
            end_index: Shape ``(K,)``, index in the block of each window's last sample.
            scores: Shape ``(K,)``, NaN for unscored windows.
            threshold: Threshold in force.
        """
        w = self.window
        buf = np.concatenate([self._tail, values]) if len(self._tail) else values
        offset = len(buf) - len(values)
        with self._lock:
            for end, score in zip(end_index.tolist(), scores.tolist(), strict=True):
                if score != score:  # noqa: PLR0124 (NaN: unscored, e.g. calibrating)
                    continue
                if self._clear_from is None:  # the first scored window after a calibration
                    self._clear_from = self._rows + end
                start = end + offset - w + 1
                if (start >= 0 and self._rows + end - w + 1 >= self._clear_from
                        and score <= threshold):
                    self._reservoir.offer(np.array(buf[start : start + w], dtype=np.float64))
            self._rows += len(values)
        self._tail = np.array(buf[-(w - 1):], dtype=np.float64) if w > 1 else buf[:0]

    def take(self, reservoir: bool) -> list[SampleBatch]:
        """Batches to upload now: the pending calibration, and (``reservoir``) the reservoir,
        which then starts over. Give failed ones back with :meth:`give_back`."""
        with self._lock:
            out = []
            if self._calibration is not None:
                out.append(self._batch("calibration", [self._calibration.tolist()]))
                self._calibration = None
            if reservoir and self._reservoir.items:
                out.append(self._batch("reservoir", [x.tolist() for x in self._reservoir.items]))
                self._reservoir = Reservoir(self._size, self._rng)
            return out

    def give_back(self, batch: SampleBatch) -> None:
        """An upload failed: keep its samples for the next attempt."""
        with self._lock:
            if batch.kind == "calibration":
                if self._calibration is None:
                    self._calibration = np.asarray(batch.windows[0], dtype=np.float64)
                return
            for win in batch.windows:  # merge back, still bounded by the reservoir size
                self._reservoir.offer(np.asarray(win, dtype=np.float64))

    def _batch(self, kind: str, windows: list[list[list[float]]]) -> SampleBatch:
        return SampleBatch(
            device_id=self.device_id, stream=self.stream, channels=list(self.channels),
            model=ModelRef(name=self.model[0], version=self.model[1]),
            config_hash=self.config_hash, sample_rate_hz=self.sample_rate_hz,
            kind=kind,
            windows=windows,
        )


class SamplesClient(Protocol):
    """What the uploader needs of :class:`cloud_sync.client.FleetClient`."""

    def post_samples(self, batch: SampleBatch) -> int: ...


class SampleUploader:
    """Upload every collector's batches from one thread.

    Args:
        client: Posts a batch (one attempt).
        collectors: By stream name.
        interval_s: Seconds between reservoir uploads.
        monotonic: Monotonic clock.
    """

    def __init__(
        self, client: SamplesClient, collectors: Mapping[str, SampleCollector],
        interval_s: float, monotonic: Callable[[], float] | None = None,
    ) -> None:
        import time  # noqa: PLC0415

        self.client = client
        self.collectors = dict(collectors)
        self.interval_s = interval_s
        self._monotonic = monotonic or time.monotonic
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        #: Windows stored by the fleet so far (all streams and kinds).
        self.stored = 0

    def notify(self) -> None:
        """A calibration finished: upload it now."""
        self._wake.set()

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name="fleet-samples", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop; a pending calibration gets one last attempt (bounded by the client timeouts)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def upload_once(self, reservoir: bool) -> int:
        """One pass over the collectors; returns the batches that failed."""
        failed = 0
        for col in self.collectors.values():
            for batch in col.take(reservoir):
                try:
                    self.stored += self.client.post_samples(batch)
                except FleetError as exc:
                    failed += 1
                    col.give_back(batch)
                    if not self._failing:
                        log.warning("samples upload failed (kept for later): %s", exc)
                    self._failing = True
                else:
                    if self._failing:
                        log.info("samples upload works again")
                    self._failing = False
                    log.info("stream %s: uploaded %d %s window(s)", batch.stream,
                             len(batch.windows), batch.kind)
        return failed

    def _run(self) -> None:
        next_reservoir = self._monotonic() + self.interval_s
        while not self._stop.is_set():
            self._wake.wait(timeout=max(0.0, next_reservoir - self._monotonic()))
            self._wake.clear()
            due = self._monotonic() >= next_reservoir
            if due:
                next_reservoir = self._monotonic() + self.interval_s
            if self.upload_once(reservoir=due) and not self._stop.is_set():
                self._stop.wait(min(60.0, self.interval_s))  # retry after a pause
                self._wake.set()
        self.upload_once(reservoir=False)
