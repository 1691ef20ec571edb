"""OpenVINO backend settings reach the compiled model (CPU plugin properties)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.inference.openvino import OpenVinoBackend, OpenVinoConfig

pytest.importorskip("openvino")

IR = Path(__file__).resolve().parents[2] / "models" / "skab-wstat" / "model.int8.xml"


def test_threads_are_not_pinned_by_default() -> None:
    """Many streams share the process: pinned inference threads piled onto the same cores."""
    backend = OpenVinoBackend(IR, "int8")
    compiled = backend._compiled  # the compiled model is private: the properties live there
    assert compiled.get_property("ENABLE_CPU_PINNING") is False
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 1


def test_pinning_and_threads_can_be_asked_for() -> None:
    backend = OpenVinoBackend(IR, "int8", OpenVinoConfig(threads=2, pin_threads=True))
    compiled = backend._compiled  # the compiled model is private: the properties live there
    assert compiled.get_property("ENABLE_CPU_PINNING") is True
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 2
