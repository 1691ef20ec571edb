"""The source supervisor: runs one source in a daemon thread with retry, metrics and logging.

Sources stay simple (:mod:`agent.sources.base`); this wraps any of them:

* a retryable :class:`agent.errors.SourceError` (or an unexpected exception, a plugin bug) counts
  ``source_errors_total``, sets ``source_up`` to 0 and is retried after an exponential backoff
  with jitter (:class:`agent.sources.backoff.Backoff`). An outage is logged once at WARNING when
  it starts and once at INFO when it ends (the first reading after it, or the source reporting
  recovery), never per retry; these lines are state changes, never rate-limited
  (:data:`agent.logs.ALWAYS`), so five outages give five "down" and five "recovered" lines;
  each outage counts ``source_outages_total`` when it starts and adds its length to
  ``source_outage_seconds_total`` when it ends (or when the stream stops during it);
* :class:`agent.errors.SourceExhausted` (a finite replay ended) is logged at INFO and ends the
  thread with :attr:`SourceSupervisor.done` set; any other non-retryable
  :class:`agent.errors.AgentError` is logged at ERROR and ends it with ``error`` set;
* every rejected record counts ``records_rejected_total{stream, reason}`` and is logged at most
  once per reason per ``reject_log_interval_s`` (the next line says how many were suppressed;
  :class:`agent.logs.RateLimiter`, the agent's one rate limiter);
* a reading whose time is no date (NaN, or outside years 1 .. 9999: a line of a serial device
  or a plugin that sent 1e30) is rejected (``reason = "bad_timestamp"``);
* a reading outside the stream's valid range (:class:`agent.sources.valid_range.ValidRange`) is
  rejected like any bad record (``reason = "out_of_range"``);
* every accepted reading counts ``readings_total``, refreshes :attr:`last_progress_mono` (for a
  watchdog) and is handed to ``emit``; a source that must not block on a full queue
  (:class:`agent.sources.base.TakesOffer`) hands its readings over with ``offer`` instead, which
  waits at most the time the source gives and says whether the reading was taken (a reading
  counts as accepted only once taken).

A source that reconnects by itself (:class:`agent.sources.base.ReportsStatus`, e.g. the serial
port) reports its failed attempts and its recovery; they are counted and logged the same way.
A source that waits by design (:class:`agent.sources.base.ReportsWaits`: a replay paced over a
gap in its recording, a slow simulator) says until when; :attr:`SourceSupervisor.waiting_until_mono`
holds it for the watchdog, which takes such a wait for no stall.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.errors import AgentError, RecordError, SourceError, SourceExhausted
from agent.logs import ALWAYS, RateLimiter, with_fields
from agent.metrics import Metrics
from agent.records import MAX_EPOCH_S, MIN_EPOCH_S, Reading
from agent.sources.backoff import Backoff
from agent.sources.base import (
    Emit,
    Offer,
    ReportsStatus,
    ReportsWaits,
    Source,
    TakesOffer,
    UsesMetrics,
)
from agent.sources.valid_range import ValidRange


class SourceSupervisor:
    """Runs ``source.run`` in a daemon thread and keeps it going.

    Args:
        source: The source to run.
        emit: Receives every accepted reading (called in the supervisor's thread).
        metrics: Where readings, rejects, errors and ``source_up`` are counted.
        stop: Set to stop the source; the thread ends soon after (within the source's read
            timeout or pacing wait, and at once during a backoff wait).
        logger: Where to log; default ``logging.getLogger(__name__)``.
        backoff_initial_s: First retry delay after a failure, seconds.
        backoff_max_s: Largest retry delay, seconds.
        backoff_multiplier: Growth of the delay per consecutive failure.
        backoff_jitter: Fraction by which each delay is randomly shortened, in [0, 1].
        reject_log_interval_s: At most one warning per reject reason per this many seconds.
        sleep: ``sleep(seconds)`` between retries; default ``stop.wait`` (wakes on stop).
        monotonic: Monotonic clock in seconds.
        rng: Random source for the jitter.
        valid_range: Bounds a reading must respect; default: finite float32 values only.
        offer: ``offer(reading, wait_s) -> taken`` downstream, for sources that must not block
            (:class:`agent.sources.base.TakesOffer`); default: ``emit``, which always takes.

    Attributes:
        stream: The source's stream name.
        last_progress_mono: ``monotonic()`` of the last accepted reading, None before the first.
        started_mono: ``monotonic()`` of :meth:`start`, None before.
        error: The fatal error that ended the thread, if any.
        waiting_until_mono: While the source waits by design, ``monotonic()`` when its next
            reading is due; None otherwise.
    """

    def __init__(
        self,
        source: Source,
        emit: Emit,
        metrics: Metrics,
        stop: threading.Event,
        logger: logging.Logger | None = None,
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        backoff_multiplier: float = 2.0,
        backoff_jitter: float = 0.5,
        reject_log_interval_s: float = 60.0,
        sleep: Callable[[float], object] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        valid_range: ValidRange | None = None,
        offer: Offer | None = None,
    ) -> None:
        self.source = source
        self._valid = valid_range if valid_range is not None else ValidRange(source.channels)
        self.stream = source.stream
        self._emit_downstream = emit
        self._offer_downstream = offer if offer is not None else _always_takes(emit)
        self._metrics = metrics
        self._stop = stop
        # every record names its stream as a structured field (JSON logs: agent.logs)
        self._log = with_fields(logger if logger is not None else logging.getLogger(__name__),
                                stream=self.stream)
        self._backoff = Backoff(
            backoff_initial_s, backoff_max_s, backoff_multiplier, backoff_jitter, rng
        )
        self._limiter = RateLimiter(reject_log_interval_s, monotonic)
        self._sleep = sleep if sleep is not None else stop.wait
        self._monotonic = monotonic
        self._readings = metrics.readings_total.labels(stream=self.stream)
        self._errors = metrics.source_errors_total.labels(stream=self.stream)
        self._up = metrics.source_up.labels(stream=self.stream)
        self._outages = metrics.source_outages_total.labels(stream=self.stream)
        self._outage_seconds = metrics.source_outage_seconds_total.labels(stream=self.stream)
        self._rejected: dict[str, Any] = {}  # reason -> records_rejected_total child
        self._thread: threading.Thread | None = None
        self._done = False
        self._in_outage = False
        self._outage_since = 0.0
        self._outage_failures = 0
        self.last_progress_mono: float | None = None
        self.started_mono: float | None = None
        self.error: BaseException | None = None
        self.waiting_until_mono: float | None = None
        self._outage_error = ""

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the daemon thread.

        Raises:
            RuntimeError: When already started.
        """
        if self._thread is not None:
            raise RuntimeError(f"supervisor for stream {self.stream!r} already started")
        if isinstance(self.source, ReportsStatus):
            self.source.set_status_listener(self._on_status)
        if isinstance(self.source, UsesMetrics):
            self.source.set_metrics(self._metrics)
        if isinstance(self.source, ReportsWaits):
            self.source.set_wait_listener(self._on_wait)
        if isinstance(self.source, TakesOffer):
            self.source.set_offer(self._offer)
        self.started_mono = self._monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"source-{self.stream}", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the thread to end (set ``stop`` first)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        """True while the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def outage(self) -> tuple[str, float] | None:
        """``(error text, monotonic start)`` of the outage in progress; None when reading."""
        if not self._in_outage:
            return None
        return self._outage_error, self._outage_since

    @property
    def done(self) -> bool:
        """True once a finite source is exhausted (the thread has ended for good)."""
        return self._done

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._up.set(0)
            if self._in_outage:  # stopped while down: the outage so far counts
                self._outage_seconds.inc(max(0.0, self._monotonic() - self._outage_since))
            for reason, count in self._limiter.drain().items():
                self._log.warning(
                    "stream %s: %d more rejected records (%s) were not logged",
                    self.stream,
                    count,
                    reason,
                )

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._in_outage:
                self._up.set(1)
            try:
                self.source.run(self._emit, self._reject, self._stop)
            except SourceExhausted as exc:
                self._log.info("stream %s: source finished: %s", self.stream, exc, extra=ALWAYS)
                self._done = True
                return
            except AgentError as exc:
                if not exc.retryable:
                    self._log.error("stream %s: source failed for good: %s", self.stream, exc,
                                    extra=ALWAYS)
                    self.error = exc
                    return
                self._on_failure(exc)
            except Exception as exc:  # a plugin bug: keep the stream alive, log the traceback
                self._on_failure(exc)
            else:
                if not self._stop.is_set():
                    self._log.warning(
                        "stream %s: source returned without being stopped; not restarting",
                        self.stream, extra=ALWAYS,
                    )
                    self._done = True
                return
            self._sleep(self._backoff.next_delay())

    # -- callbacks (all called in the supervisor's thread) -----------------------------------

    def _emit(self, reading: Reading) -> None:
        if self._valid_reading(reading):
            self._accepted()
            self._emit_downstream(reading)

    def _offer(self, reading: Reading, wait_s: float) -> bool:
        if not self._valid_reading(reading):
            return True  # rejected and counted: taken
        if not self._offer_downstream(reading, wait_s):
            return False
        self._accepted()
        return True

    def _valid_reading(self, reading: Reading) -> bool:
        """False (and the reading rejected) when its time is no date or a value is out of range."""
        if not MIN_EPOCH_S <= reading.ts <= MAX_EPOCH_S:  # also NaN: no later stage can use it
            self._reject(RecordError(f"reading time {reading.ts!r} is not a date (years "
                                     "1 .. 9999)", reason="bad_timestamp"))
            return False
        invalid = self._valid.check(reading.values)
        if invalid is not None:
            self._reject(invalid)
            return False
        return True

    def _accepted(self) -> None:
        self._readings.inc()
        self.last_progress_mono = self._monotonic()
        if self._in_outage:
            self._on_recovery()

    def _reject(self, error: RecordError) -> None:
        child = self._rejected.get(error.reason)
        if child is None:
            child = self._metrics.records_rejected_total.labels(stream=self.stream,
                                                                reason=error.reason)
            self._rejected[error.reason] = child
        child.inc()
        suppressed = self._limiter.hit(error.reason)
        if suppressed is None:
            return
        if suppressed:
            self._log.warning(
                "stream %s: record rejected (%s): %s [%d more like it suppressed in the last "
                "%.0f s]",
                self.stream,
                error.reason,
                error,
                suppressed,
                self._limiter.interval_s,
            )
        else:
            self._log.warning(
                "stream %s: record rejected (%s): %s", self.stream, error.reason, error
            )

    def _on_wait(self, due_mono: float | None) -> None:
        self.waiting_until_mono = due_mono

    def _on_status(self, error: SourceError | None) -> None:
        if error is None:
            self._on_recovery()
        else:
            self._on_failure(error)

    def _on_failure(self, error: BaseException) -> None:
        self._errors.inc()
        self._up.set(0)
        self._outage_error = str(error) or type(error).__name__
        if self._in_outage:
            self._outage_failures += 1
            return
        self._in_outage = True
        self._outage_since = self._monotonic()
        self._outage_failures = 1
        self._outages.inc()
        self._log.warning(
            "stream %s: source down: %s; retrying with backoff (logged again on recovery)",
            self.stream,
            error,
            exc_info=None if isinstance(error, AgentError) else error, extra=ALWAYS,
        )

    def _on_recovery(self) -> None:
        self._backoff.reset()
        self._up.set(1)
        if not self._in_outage:
            return
        self._in_outage = False
        down_s = max(0.0, self._monotonic() - self._outage_since)
        self._outage_seconds.inc(down_s)
        self._log.info(
            "stream %s: source recovered after %.1f s and %d failed attempt(s)",
            self.stream,
            down_s,
            self._outage_failures,
            extra=ALWAYS,
        )


def _always_takes(emit: Emit) -> Offer:
    """An offer that hands the reading to ``emit`` (which may block) and always takes it."""

    def offer(reading: Reading, _wait_s: float) -> bool:
        emit(reading)
        return True

    return offer
