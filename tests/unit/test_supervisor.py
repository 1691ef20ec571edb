"""SourceSupervisor with scripted fake sources, a fake sleep and a fake clock."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.errors import ConfigError, RecordError, SourceError, SourceExhausted
from agent.logs import RateLimiter, RateLimitFilter
from agent.metrics import Metrics
from agent.records import Reading
from agent.services.supervisor import SourceSupervisor
from agent.sources.base import Emit, Reject, StatusListener

Step = Callable[[Emit, Reject, threading.Event], None]


def reading(i: int = 0) -> Reading:
    return Reading("s", float(i), np.array([float(i)]))


class ScriptedSource:
    """Each call to run() performs the next step of the script; then it is exhausted."""

    stream: str = "s"
    channels: tuple[str, ...] = ("x",)

    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps
        self.calls = 0

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        self.calls += 1
        if not self.steps:
            raise SourceExhausted("end", stream=self.stream)
        self.steps.pop(0)(emit, reject, stop)


def fail(emit: Emit, reject: Reject, stop: threading.Event) -> None:
    raise SourceError("port gone", stream="s")


def emit_two_then_fail(emit: Emit, reject: Reject, stop: threading.Event) -> None:
    emit(reading(1))
    emit(reading(2))
    raise SourceError("port gone again", stream="s")


def value(metrics: Metrics, name: str, **labels: str) -> float:
    v = metrics.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


class Harness:
    def __init__(
        self, source: object, logger: logging.Logger | None = None, **kwargs: object
    ) -> None:
        self.metrics = Metrics(CollectorRegistry())
        self.stop = threading.Event()
        self.sleeps: list[float] = []
        self.out: list[Reading] = []
        self.sup = SourceSupervisor(
            source,  # type: ignore[arg-type]
            self.out.append,
            self.metrics,
            self.stop,
            logger or logging.getLogger("test.supervisor"),
            backoff_initial_s=1.0,
            backoff_max_s=8.0,
            backoff_jitter=0.0,
            sleep=self.sleeps.append,
            **kwargs,  # type: ignore[arg-type]
        )

    def run(self, timeout: float = 5.0) -> None:
        self.sup.start()
        self.sup.join(timeout)
        assert not self.sup.is_alive()


def test_retries_with_exponential_backoff_then_exhausts(caplog: pytest.LogCaptureFixture) -> None:
    src = ScriptedSource([fail, fail, fail, fail, fail])
    h = Harness(src)
    with caplog.at_level(logging.INFO, logger="test.supervisor"):
        h.run()
    assert h.sleeps == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert src.calls == 6
    assert h.sup.done
    assert value(h.metrics, "edge_agent_source_errors_total", stream="s") == 5
    assert value(h.metrics, "edge_agent_source_up", stream="s") == 0
    down = [r for r in caplog.records if "source down" in r.getMessage()]
    assert len(down) == 1  # once per outage, not per retry
    assert any(r.levelno == logging.INFO and "finished" in r.getMessage() for r in caplog.records)


def test_backoff_resets_and_recovery_logged_after_a_reading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    src = ScriptedSource([fail, fail, emit_two_then_fail, fail])
    h = Harness(src)
    with caplog.at_level(logging.INFO, logger="test.supervisor"):
        h.run()
    assert h.sleeps == [1.0, 2.0, 1.0, 2.0]  # reset by the readings
    assert [r.ts for r in h.out] == [1.0, 2.0]
    assert value(h.metrics, "edge_agent_readings_total", stream="s") == 2
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("source down" in m for m in msgs) == 2  # two separate outages
    recovered = [m for m in msgs if "recovered" in m]
    assert len(recovered) == 1 and "2 failed attempt(s)" in recovered[0]
    assert h.sup.last_progress_mono is not None


def test_unexpected_exception_is_retried_with_traceback(caplog: pytest.LogCaptureFixture) -> None:
    def bug(emit: Emit, reject: Reject, stop: threading.Event) -> None:
        raise ZeroDivisionError("oops")

    h = Harness(ScriptedSource([bug, bug]))
    with caplog.at_level(logging.WARNING, logger="test.supervisor"):
        h.run()
    assert h.sup.done
    assert h.sleeps == [1.0, 2.0]
    down = [r for r in caplog.records if "source down" in r.getMessage()]
    assert len(down) == 1 and down[0].exc_info is not None


def test_fatal_error_ends_without_retry(caplog: pytest.LogCaptureFixture) -> None:
    def bad_config(emit: Emit, reject: Reject, stop: threading.Event) -> None:
        raise ConfigError("invalid baud rate")

    h = Harness(ScriptedSource([bad_config]))
    with caplog.at_level(logging.ERROR, logger="test.supervisor"):
        h.run()
    assert isinstance(h.sup.error, ConfigError)
    assert not h.sup.done
    assert h.sleeps == []
    assert any("invalid baud rate" in r.getMessage() for r in caplog.records)


def test_exhaustion_ends_and_readings_counted() -> None:
    def three(emit: Emit, reject: Reject, stop: threading.Event) -> None:
        for i in range(3):
            emit(reading(i))

    # A run() that returns without stop means the plugin ended; the next call never comes.
    src = ScriptedSource([three])
    h = Harness(src)
    h.run()
    assert h.sup.done
    assert len(h.out) == 3
    assert value(h.metrics, "edge_agent_readings_total", stream="s") == 3


def test_reject_counting_and_rate_limited_logging(caplog: pytest.LogCaptureFixture) -> None:
    def many_rejects(emit: Emit, reject: Reject, stop: threading.Event) -> None:
        for i in range(500):
            reject(RecordError(f"bad value {i}", reason="non_numeric"))
        for _ in range(3):
            reject(RecordError("too long", reason="too_long"))
        emit(reading(1))

    h = Harness(ScriptedSource([many_rejects]), monotonic=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="test.supervisor"):
        h.run()
    rejected = "edge_agent_records_rejected_total"
    assert value(h.metrics, rejected, stream="s", reason="non_numeric") == 500
    assert value(h.metrics, rejected, stream="s", reason="too_long") == 3
    msgs = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    first = [m for m in msgs if "record rejected (non_numeric)" in m]
    assert len(first) == 1 and "bad value 0" in first[0]
    assert len([m for m in msgs if "record rejected (too_long)" in m]) == 1
    # The suppressed ones are summarised when the thread ends.
    assert any("499 more rejected records (non_numeric)" in m for m in msgs)
    assert any("2 more rejected records (too_long)" in m for m in msgs)
    assert len(h.out) == 1


def test_reject_log_says_how_many_were_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]

    def rejects_over_time(emit: Emit, reject: Reject, stop: threading.Event) -> None:
        for _ in range(10):
            reject(RecordError("x", reason="non_finite"))
            now[0] += 10.0  # 100 s in total

    h = Harness(ScriptedSource([rejects_over_time]), monotonic=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.supervisor"):
        h.run()
    msgs = [r.getMessage() for r in caplog.records if "record rejected" in r.getMessage()]
    assert len(msgs) == 2  # at t=0 and t=60
    assert "5 more like it suppressed" in msgs[1]


def test_stop_ends_thread_promptly() -> None:
    def block(emit: Emit, reject: Reject, stop: threading.Event) -> None:
        emit(reading(1))
        stop.wait(10)

    h = Harness(ScriptedSource([block]))
    h.sup.start()
    for _ in range(200):
        if h.out:
            break
        threading.Event().wait(0.01)
    assert value(h.metrics, "edge_agent_source_up", stream="s") == 1
    h.stop.set()
    h.sup.join(2.0)
    assert not h.sup.is_alive()
    assert not h.sup.done
    assert value(h.metrics, "edge_agent_source_up", stream="s") == 0


def test_default_sleep_is_interrupted_by_stop() -> None:
    metrics = Metrics(CollectorRegistry())
    stop = threading.Event()
    sup = SourceSupervisor(
        ScriptedSource([fail] * 100),
        lambda r: None,
        metrics,
        stop,
        backoff_initial_s=30.0,
        backoff_max_s=30.0,
    )
    sup.start()
    for _ in range(200):
        if value(metrics, "edge_agent_source_errors_total", stream="s") >= 1:
            break
        threading.Event().wait(0.01)
    stop.set()
    sup.join(2.0)
    assert not sup.is_alive()


class StatusSource:
    """Heals itself inside run() and reports through the status listener."""

    stream: str = "s"
    channels: tuple[str, ...] = ("x",)

    def __init__(self) -> None:
        self.listener: StatusListener | None = None

    def set_status_listener(self, listener: StatusListener | None) -> None:
        self.listener = listener

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        assert self.listener is not None
        for _ in range(3):
            self.listener(SourceError("cannot open", stream="s"))
        self.listener(None)
        emit(reading(1))
        raise SourceExhausted("end")


def test_status_reporting_source_counts_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(StatusSource())
    with caplog.at_level(logging.INFO, logger="test.supervisor"):
        h.run()
    assert value(h.metrics, "edge_agent_source_errors_total", stream="s") == 3
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("source down" in m for m in msgs) == 1
    assert sum("recovered" in m for m in msgs) == 1
    assert h.sleeps == []  # the source waited itself


def test_start_twice_raises() -> None:
    h = Harness(ScriptedSource([]))
    h.run()
    with pytest.raises(RuntimeError):
        h.sup.start()


def test_rate_limiter() -> None:
    now = [0.0]
    rl = RateLimiter(60.0, lambda: now[0])
    assert rl.hit("a") == 0
    assert rl.hit("a") is None
    assert rl.hit("b") == 0
    now[0] = 59.9
    assert rl.hit("a") is None
    now[0] = 60.0
    assert rl.hit("a") == 2
    assert rl.drain() == {}


def test_jitter_shortens_delays_within_bounds() -> None:
    metrics = Metrics(CollectorRegistry())
    sleeps: list[float] = []
    sup = SourceSupervisor(
        ScriptedSource([fail] * 6),
        lambda r: None,
        metrics,
        threading.Event(),
        backoff_initial_s=1.0,
        backoff_max_s=4.0,
        backoff_jitter=0.5,
        sleep=sleeps.append,
        rng=random.Random(1),
    )
    sup.start()
    sup.join(5)
    bases = [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert all(b / 2 <= s <= b for s, b in zip(sleeps, bases, strict=True))
    assert len(set(sleeps)) == len(sleeps)


class _Lines(logging.Handler):
    """A handler with the agent's RateLimitFilter, keeping the lines it emits."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_every_outage_and_recovery_passes_the_log_rate_limit() -> None:
    """Five outages in well under 30 s: five "source down" and five "recovered" lines through
    the same 30 s de-duplication the CLI installs (state changes are never de-duplicated)."""
    handler = _Lines()
    handler.addFilter(RateLimitFilter(30.0))
    logger = logging.getLogger("test.supervisor.dedup")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        Harness(ScriptedSource([emit_two_then_fail] * 5), logger).run()
    finally:
        logger.removeHandler(handler)
    assert sum("source down" in m for m in handler.lines) == 5, handler.lines
    assert sum("source recovered" in m for m in handler.lines) == 4, handler.lines
    assert sum("source finished" in m for m in handler.lines) == 1


def test_a_reading_time_that_is_no_date_is_rejected_not_passed_on() -> None:
    # a serial line "1e30,1,2,..." (or any source's) reading time used to reach the app, which
    # died with OverflowError formatting it
    def odd_times(emit: Emit, reject: Reject, stop: threading.Event) -> None:
        for ts in (1e30, float("nan"), -1e20, 1_767_225_600.0):
            emit(Reading("s", ts, np.array([1.0])))

    h = Harness(ScriptedSource([odd_times]))
    h.run()
    assert [r.ts for r in h.out] == [1_767_225_600.0]
    assert value(h.metrics, "edge_agent_records_rejected_total", stream="s",
                 reason="bad_timestamp") == 3


def test_outages_and_their_seconds_are_counted() -> None:
    """Two outages (3 s, then 5 s) and one still open when the stream stops (2 s so far):
    three outages, however many failed attempts each had, and 10 s down."""
    clock = [100.0]

    class Flapping(StatusSource):
        def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
            assert self.listener is not None
            for down_s, attempts in ((3.0, 4), (5.0, 1)):
                for _ in range(attempts):
                    self.listener(SourceError("broker gone", stream="s"))
                clock[0] += down_s
                self.listener(None)
                clock[0] += 60.0  # up: not counted
            self.listener(SourceError("broker gone", stream="s"))
            clock[0] += 2.0
            raise SourceExhausted("end")

    h = Harness(Flapping(), monotonic=lambda: clock[0])
    h.run()
    assert value(h.metrics, "edge_agent_source_outages_total", stream="s") == 3
    assert value(h.metrics, "edge_agent_source_outage_seconds_total", stream="s") == 10.0
    assert value(h.metrics, "edge_agent_source_errors_total", stream="s") == 6
