"""The composition root opens each stream's backend through selection and the latency guard."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import agent.run_loop as run_loop
from agent.app import Agent
from agent.config.loader import parse_config
from agent.inference.deadline import DeadlineGuard
from agent.inference.registry import installed
from agent.metrics import Metrics
from agent.systemd import Notifier


def _agent(tmp_path: Path, backend: str, precision: str = "int8") -> Agent:
    text = "\n".join([
        "[agent]", 'device_id = "gw1"', f'state_dir = "{tmp_path / "state"}"',
        "console_alerts = false",
        "[[streams]]", 'name = "demo"', f'backend = "{backend}"', f'precision = "{precision}"',
        "[streams.source]", 'kind = "simulator"',
    ]) + "\n"
    return Agent(parse_config(text, env={}), Metrics(), console=None, notifier=Notifier(""))


def test_auto_records_the_selection_and_guards_the_backend(tmp_path: Path) -> None:
    agent = _agent(tmp_path, "auto")
    try:
        s = agent.streams["demo"]
        assert isinstance(s.backend, DeadlineGuard)
        reg = agent.metrics.registry
        chosen = [lab for lab in ("onnxruntime", "openvino", "openvino-onnx", "litert")
                  if reg.get_sample_value("edge_agent_backend_selected", {
                      "stream": "demo", "backend": lab, "precision": "int8"}) == 1]
        assert len(chosen) == 1
        assert reg.get_sample_value("edge_agent_backend_benchmark_seconds", {
            "stream": "demo", "backend": chosen[0], "precision": "int8"}) > 0
        assert reg.get_sample_value("edge_agent_degraded", {
            "stream": "demo", "level": "skip_windows"}) == 0
        # the degrade step "skip windows" raises the stream's hop
        hop = s.pipeline.windower.hop
        assert s.backend.on_stride is not None
        s.backend.on_stride(2)
        assert s.pipeline.windower.hop == 2 * hop
        s.backend.on_stride(1)
        assert s.pipeline.windower.hop == hop
    finally:
        agent.shutdown()


@pytest.mark.parametrize(("backend", "precision"), [("onnxruntime", "fp32"),
                                                    ("openvino", "int8"), ("litert", "int8")])
def test_a_pinned_backend_is_used(tmp_path: Path, backend: str, precision: str) -> None:
    if not installed(backend):
        pytest.skip(f"{backend} is not installed")
    agent = _agent(tmp_path, backend, precision)
    try:
        b = agent.streams["demo"].backend
        assert (b.name, b.precision) == (backend, precision)
    finally:
        agent.shutdown()


def test_shutdown_scores_queued_readings_for_a_bounded_time_then_counts_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = _agent(tmp_path, "auto")
    monkeypatch.setattr(run_loop, "SHUTDOWN_DRAIN_S", 0.2)
    scored: list[object] = []

    def slow_drain(timeout: float) -> None:  # a pipeline far behind its source
        scored.append(agent.queue.get_nowait())
        time.sleep(0.05)

    monkeypatch.setattr(agent, "_drain_once", slow_drain)
    for i in range(1000):
        agent.queue.put(i)  # type: ignore[arg-type]  # the patched drain only counts them
    t0 = time.monotonic()
    agent.shutdown()
    assert time.monotonic() - t0 < 20.0  # not 1,000 x 50 ms
    dropped = agent.metrics.registry.get_sample_value(
        "edge_agent_dropped_total", {"kind": "reading", "reason": "shutdown"})
    assert 1 <= len(scored) < 1000
    assert dropped == 1000 - len(scored) == agent.readings_dropped
    assert agent.queue.empty()
