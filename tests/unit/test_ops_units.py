"""Pure ops pieces: the log rate limit, the health model and stall policy, the notifier."""

from __future__ import annotations

import io
import json
import logging
import socket
import time
from pathlib import Path

import pytest

from agent import cli
from agent.config.builtin_models import MODELS_DIR_ENV
from agent.config.schema import resolve_model_path
from agent.health import (
    Component,
    Report,
    SourceView,
    StallPolicy,
    source_health,
    stall_policy,
)
from agent.logs import ALWAYS, JsonFormatter, RateLimitFilter, setup_logging
from agent.sources.replay import ReplayConfig
from agent.sources.serial import SerialConfig
from agent.sources.simulator import SimulatorConfig
from agent.systemd import Notifier, watchdog_interval_s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, *args: object, name: str = "agent.x") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def test_rate_limit_lets_one_through_per_interval_and_counts_the_rest() -> None:
    clock = Clock()
    f = RateLimitFilter(10.0, clock)
    assert f.filter(_record("disk %d full", 1))
    # numbers are not part of the key: the same message with a new count is a repeat
    assert [f.filter(_record("disk %d full", n)) for n in (2, 3, 4)] == [False, False, False]
    # another template, another logger, or another string argument (a stream, a reason) is
    # another message
    assert f.filter(_record("other %s", 1))
    assert f.filter(_record("disk %d full", 1, name="agent.y"))
    assert f.filter(_record("port %s gone", "a"))
    assert f.filter(_record("port %s gone", "b"))
    assert not f.filter(_record("port %s gone", "a"))
    clock.now += 10.0
    rec = _record("disk %d full", 5)
    assert f.filter(rec)
    assert rec.getMessage() == "disk 5 full [3 similar messages suppressed in the last 10 s]"
    assert rec.suppressed == 3  # type: ignore[attr-defined]
    clock.now += 10.0
    quiet = _record("disk %d full", 6)
    assert f.filter(quiet) and quiet.getMessage() == "disk 6 full"


def test_rate_limit_lets_operator_events_through_every_time() -> None:
    """A second SIGHUP within the interval must still be logged (a tester saw it vanish)."""
    f = RateLimitFilter(30.0, Clock())
    events = []
    for _ in range(3):
        rec = _record("SIGHUP received; checking %s", "agent.toml")
        rec.__dict__.update(ALWAYS)
        events.append(f.filter(rec))
    assert events == [True, True, True]
    plain = _record("SIGHUP received; checking %s", "agent.toml")
    assert f.filter(plain) and not f.filter(_record("SIGHUP received; checking %s", "agent.toml"))


def test_rate_limit_zero_disables() -> None:
    f = RateLimitFilter(0.0, Clock())
    assert all(f.filter(_record("x")) for _ in range(5))


def test_setup_logging_installs_the_filter_and_json_reports_suppressed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("INFO", "json", rate_limit_s=3600)
        installed = root.handlers[0]
        flt = next(f for f in installed.filters if isinstance(f, RateLimitFilter))
        assert isinstance(installed.formatter, JsonFormatter)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    # Exercise the installed filter and formatter on a private logger, so threads left over by
    # other tests (which may log, or even call setup_logging again) cannot interfere.
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(flt)
    handler.setFormatter(installed.formatter)
    log = logging.getLogger("agent.test.ratelimit")
    log.propagate = False
    log.addHandler(handler)
    try:
        for i in range(5):
            log.warning("disk %d full", i)
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert [line["message"] for line in lines] == ["disk 0 full"]
        flt.interval_s = 0.0001
        time.sleep(0.01)  # past the (now tiny) interval, whatever the clock's resolution
        log.warning("disk %d full", 9)
        last = json.loads(stream.getvalue().splitlines()[-1])
        assert last["suppressed"] == 4 and "4 similar messages suppressed" in last["message"]
    finally:
        log.removeHandler(handler)
        log.propagate = True


# -- health ---------------------------------------------------------------------------------------


def test_stall_policy_per_source_kind() -> None:
    chans = ["a"]
    fast = SimulatorConfig(sample_rate_hz=1.0, speed=0.0)
    assert stall_policy(fast, 1.0) == StallPolicy(30, True)
    assert stall_policy(SimulatorConfig(sample_rate_hz=0.05, speed=1.0), 1.0).limit_s == 200.0
    replay = ReplayConfig(path="x.csv", channels=chans, speed=1.0)
    assert stall_policy(replay, 0.1) == StallPolicy(100.0, True)
    serial = SerialConfig(port="/dev/ttyUSB0", channels=chans)
    assert stall_policy(serial, 1.0) == StallPolicy(30.0, False)
    assert stall_policy(serial, 1.0, override_s=12.0) == StallPolicy(12.0, True)


@pytest.mark.parametrize(
    ("view", "state", "blocks", "words"),
    [
        (SourceView(True, True, False, None, None, 0.0, 1.0), "green", False, None),
        (SourceView(False, False, False, None, None, 0.0, 99.0), "green", False, None),
        (SourceView(True, False, True, None, None, 0.0, 99.0), "yellow", False, "exhausted"),
        (SourceView(True, False, False, "bad", None, 0.0, 9.0), "red", True, "failed for good"),
        (SourceView(True, True, False, None, "port gone", 40.0, 40.0), "red", False, "down"),
        (SourceView(True, True, False, None, None, 0.0, 31.0), "red", True, "stalled"),
    ],
)
def test_source_health(view: SourceView, state: str, blocks: bool, words: str | None) -> None:
    comp, blocked = source_health("s", view, StallPolicy(30.0, True))
    assert (comp.state, blocked) == (state, blocks)
    if words is None:
        assert comp.reason is None
    else:
        assert comp.reason is not None and words in comp.reason


def test_report_overall_status_and_json() -> None:
    report = Report(
        (Component("a", "green"), Component("b", "yellow", "slow", {"n": 1})), at=5.0
    )
    assert (report.overall, report.http_status) == ("yellow", 200)
    body = report.to_json()
    assert body["status"] == "yellow"
    assert body["components"] == {
        "a": {"state": "green", "reason": None},
        "b": {"state": "yellow", "reason": "slow", "n": 1},
    }
    red = report.replace(Component("a", "red", "stuck"))
    assert [c.name for c in red.components] == ["a", "b"]
    assert (red.overall, red.http_status) == ("red", 503)


# -- systemd notifier and models dir ------------------------------------------------------------


def test_watchdog_interval_from_systemd_environment() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, pid=2) == 5.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "7"}, pid=7) == 2.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "junk"}) == 5.0


def test_notifier_extend_and_reloading(tmp_path: Path) -> None:
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        n = Notifier(str(path))
        assert n.extend_timeout(1.5, "compiling")
        assert sock.recv(1024) == b"EXTEND_TIMEOUT_USEC=1500000\nSTATUS=compiling"
        assert n.reloading()
        fields = dict(x.split("=", 1) for x in sock.recv(1024).decode().splitlines())
        assert fields["RELOADING"] == "1" and int(fields["MONOTONIC_USEC"]) > 0
        n.close()


def test_builtin_models_dir_from_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path / "models"))
    assert resolve_model_path("builtin:m", Path("/etc")) == tmp_path / "models" / "m"
    monkeypatch.setenv(MODELS_DIR_ENV, "")
    assert resolve_model_path("builtin:m", Path("/etc")).parent.name == "models"


def test_status_refuses_a_config_without_metrics_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Probing the default port would report whichever agent listens there (a tester's find)."""
    cfg = tmp_path / "agent.toml"
    assert cli.main(["print-default-config"]) == 0  # a valid config without metrics_port
    cfg.write_text(capsys.readouterr().out)
    assert cli.main(["status", "--config", str(cfg)]) == 3
    err = capsys.readouterr().err
    assert "sets no agent.metrics_port" in err and err.count("\n") == 1
