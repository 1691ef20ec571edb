"""Log formats for journald and log shippers (agent.logs), and the agent's one rate limiter."""

from __future__ import annotations

import ast
import io
import json
import logging
import os
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.cli import _parser
from agent.config.schema import AgentSection
from agent.errors import SourceError
from agent.logs import (
    ALWAYS,
    JournalFormatter,
    JsonFormatter,
    formatter_for,
    setup_logging,
    under_journal,
    with_fields,
)
from agent.metrics import Metrics
from agent.records import Reading
from agent.services.supervisor import SourceSupervisor

ROOT = Path(__file__).resolve().parents[2]


def record(level: int, msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("agent.test", level, __file__, 1, msg, args or None, None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def journal_env(path: Path) -> dict[str, str]:
    st = os.stat(path)
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


@pytest.mark.parametrize(
    ("level", "prefix"),
    [(logging.CRITICAL, "<2>"), (logging.ERROR, "<3>"), (logging.WARNING, "<4>"),
     (logging.INFO, "<6>"), (logging.DEBUG, "<7>")],
)
def test_journal_lines_carry_the_sd_daemon_priority_and_no_timestamp(
    level: int, prefix: str
) -> None:
    line = JournalFormatter().format(record(level, "stream %s: source down", "p1"))
    assert line == f"{prefix}{logging.getLevelName(level)} agent.test: stream p1: source down"


def test_every_line_of_a_traceback_has_the_records_priority() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("agent.test", logging.ERROR, __file__, 1, "failed", None,
                                __import__("sys").exc_info())
    lines = JournalFormatter().format(rec).splitlines()
    assert len(lines) > 3
    assert all(line.startswith("<3>") for line in lines)
    assert lines[-1] == "<3>ValueError: boom"


def test_under_journal_compares_the_stream_with_journal_stream(tmp_path: Path) -> None:
    path = tmp_path / "stderr"
    other = tmp_path / "other"
    other.write_text("")
    with path.open("w") as stream:
        assert under_journal(stream, journal_env(path))
        assert not under_journal(stream, journal_env(other))  # inherited, stderr redirected
        assert not under_journal(stream, {})
        assert not under_journal(stream, {"JOURNAL_STREAM": "garbage"})
    assert not under_journal(io.StringIO(), journal_env(path))  # no file descriptor


def test_auto_is_journal_under_journald_and_text_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "stderr"
    with path.open("w") as stream:
        assert isinstance(formatter_for("auto", stream, journal_env(path)), JournalFormatter)
        text = formatter_for("auto", stream, {})
        assert not isinstance(text, JournalFormatter | JsonFormatter)
        assert formatter_for("text", stream, journal_env(path)).format(
            record(logging.INFO, "x")).endswith("INFO    agent.test: x")
        json_fmt = formatter_for("json", stream, journal_env(path))
        assert isinstance(json_fmt, JsonFormatter) and json_fmt.priority_prefix
        assert not formatter_for("json", stream, {}).priority_prefix  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown log format"):
        formatter_for("xml")  # type: ignore[arg-type]


def test_setup_logging_under_journald_writes_prefixed_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "stderr"
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        with path.open("w") as stream:
            monkeypatch.setenv("JOURNAL_STREAM", journal_env(path)["JOURNAL_STREAM"])
            setup_logging("INFO", "auto", stream=stream)
            logging.getLogger("agent.x").warning("stream %s: quiet", "p1")
            logging.getLogger("agent.x").debug("not at INFO")
            setup_logging("INFO", "json", stream=stream)
            logging.getLogger("agent.x").error("alert %s lost", "a:1", extra={"alert_id": "a:1"})
    finally:
        root.handlers[:], root.level = saved
    first, second = path.read_text().splitlines()
    assert first == "<4>WARNING agent.x: stream p1: quiet"
    assert second.startswith("<3>{")
    assert json.loads(second[3:])["alert_id"] == "a:1"


def test_json_keeps_structured_fields_as_top_level_keys() -> None:
    rec = record(logging.WARNING, "stream %s: model %s@%d rejected", "p1", "pump", 3,
                 stream="p1", model_version=3, alert_id=None, device="gw-7",
                 path=Path("/x"), message="not the message", always=True)
    obj = json.loads(JsonFormatter().format(rec))
    assert obj["message"] == "stream p1: model pump@3 rejected"  # standard keys win
    assert obj["stream"] == "p1" and obj["model_version"] == 3 and obj["device"] == "gw-7"
    assert obj["alert_id"] is None
    assert obj["path"] == "/x"  # not JSON: its str
    assert "always" not in obj and "args" not in obj and "levelno" not in obj
    assert set(obj) >= {"ts", "level", "logger"}


def test_with_fields_merges_a_calls_own_extra(caplog: pytest.LogCaptureFixture) -> None:
    log = with_fields(logging.getLogger("agent.fields"), stream="p1")
    nested = with_fields(log, model_version=4)
    with caplog.at_level(logging.INFO, logger="agent.fields"):
        log.info("up", extra=ALWAYS)
        nested.info("swapped", extra={"stream": "p2"})
    up, swapped = caplog.records
    assert (up.stream, up.always) == ("p1", True)  # type: ignore[attr-defined]
    assert (swapped.stream, swapped.model_version) == ("p2", 4)  # type: ignore[attr-defined]


def test_the_source_supervisor_names_its_stream_as_a_field(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing:
        stream = "pump-7"
        channels = ("x",)

        def __init__(self) -> None:
            self.calls = 0

        def run(self, emit: object, reject: object, stop: threading.Event) -> None:
            self.calls += 1
            if self.calls > 1:
                stop.set()
                return
            raise SourceError("port gone", stream=self.stream)

    stop = threading.Event()
    out: list[Reading] = []
    sup = SourceSupervisor(Failing(), out.append, Metrics(CollectorRegistry()), stop,  # type: ignore[arg-type]
                           logging.getLogger("test.fields"), backoff_jitter=0.0,
                           sleep=lambda s: None)
    with caplog.at_level(logging.INFO, logger="test.fields"):
        sup.start()
        sup.join(30.0)
    assert not sup.is_alive()
    down = [r for r in caplog.records if "source down" in r.getMessage()]
    assert down and all(r.stream == "pump-7" for r in down)  # type: ignore[attr-defined]


def test_log_format_is_configurable_and_defaults_to_auto() -> None:
    assert AgentSection().log_format == "auto"
    assert AgentSection(log_format="journal").log_format == "journal"
    args = _parser().parse_args(["run", "--log-format", "journal"])
    assert args.log_format == "journal"
    assert _parser().parse_args(["run"]).log_format is None


def test_one_rate_limiter_in_the_agent() -> None:
    """agent.logs.RateLimiter is the only rate limiter: no other class limits rates."""
    found = []
    for path in sorted((ROOT / "agent").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                word in node.name.lower() for word in ("ratelimit", "throttl", "limiter")
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert sorted(found) == ["agent/logs.py:RateLimitFilter", "agent/logs.py:RateLimiter"]
