"""Remembered backend selections (agent.inference.choice_memory): a restart opens only the
candidates it ranked first, each golden-checked; a ranking that no longer fits is forgotten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.inference.choice_memory import ChoiceMemory, selection_key
from agent.inference.package import ModelPackage
from agent.inference.select import Remembering
from tests.unit.test_backend_select import SPEEDS, _select, package  # noqa: F401 - fixture


def _remembering(tmp_path: Path, pkg: ModelPackage, keep: int = 2) -> Remembering:
    return Remembering(ChoiceMemory.in_state_dir(tmp_path), selection_key(pkg, "auto", "int8", 1),
                       keep)


def test_a_restart_opens_only_the_remembered_first_candidates(
        tmp_path: Path, package: ModelPackage) -> None:  # noqa: F811
    first, opened = _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package))
    assert sorted(opened) == ["litert", "onnxruntime", "openvino", "openvino-onnx"]
    assert not first.remembered
    again, opened = _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package))
    assert sorted(opened) == ["litert", "openvino"]  # the two fastest; nothing else imported
    assert again.remembered and again.chosen.candidate.label == "litert"
    assert [t.candidate.label for t in again.passing] == [
        t.candidate.label for t in first.passing]
    assert [t.p50_s for t in again.passing] == [t.p50_s for t in first.passing]
    assert len(again.backends) == 2


def test_a_remembered_candidate_failing_its_golden_check_means_a_full_selection(
        tmp_path: Path, package: ModelPackage) -> None:  # noqa: F811
    _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package))
    sel, opened = _select(package, SPEEDS, {"openvino": 1.0},
                          remembering=_remembering(tmp_path, package))
    assert not sel.remembered and opened["litert"].calls > 0
    assert "openvino" not in [t.candidate.label for t in sel.passing]
    stored = ChoiceMemory.in_state_dir(tmp_path).get(selection_key(package, "auto", "int8", 1))
    assert stored is not None and [k for k, _, _ in stored] == ["litert", "onnxruntime",
                                                                 "openvino"]


def test_another_key_or_an_unreadable_file_selects_again(
        tmp_path: Path, package: ModelPackage) -> None:  # noqa: F811
    memory = ChoiceMemory.in_state_dir(tmp_path)
    _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package))
    assert selection_key(package, "auto", "int8", 2) != selection_key(package, "auto", "int8", 1)
    other = Remembering(memory, selection_key(package, "auto", "fp32", 1), 2)
    sel, opened = _select(package, SPEEDS, {}, remembering=other)
    assert not sel.remembered and len(opened) == 4
    memory.path.write_text("{not json")
    sel, opened = _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package))
    assert not sel.remembered and len(opened) == 4
    assert json.loads(memory.path.read_text())  # written again


def test_the_file_keeps_the_newest_entries(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.inference.choice_memory.MAX_ENTRIES", 2)
    memory = ChoiceMemory(tmp_path / "c.json")
    for key in ("a", "b", "c"):
        memory.put(key, [("litert", "m.tflite", 1e-5)])
    assert memory.get("a") is None and memory.get("c") == [("litert", "m.tflite", 1e-5)]
