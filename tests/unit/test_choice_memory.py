"""Remembered backend selections (agent.inference.choice_memory): a restart opens only the
candidates it ranked first, each golden-checked; a ranking that no longer fits is forgotten."""

from __future__ import annotations

import json
import resource
import signal
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.inference.base import Backend
from agent.inference.choice_memory import ChoiceMemory, selection_key
from agent.inference.deadline import DeadlineGuard, DegradeParams
from agent.inference.package import ModelPackage
from agent.inference.select import AnyPackage, Candidate, Remembering, deferred_open
from agent.metrics import Metrics
from agent.sensor_streams import OPENED_AT_START, _guard_backends
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


def test_forgetting_on_a_full_disk_keeps_the_other_rankings(tmp_path: Path) -> None:
    """A write that fails part-way (here the file-size limit, as a full disk would) must not
    leave a truncated file: every other model would then time all its runtimes again."""
    mem = ChoiceMemory.in_state_dir(tmp_path)
    for i in range(10):
        mem.put(f"key{i}", [("onnxruntime", "model.int8.onnx", 1e-5 * (i + 1))])
    limit = mem.path.stat().st_size // 2  # the rewrite without key0 is larger than this
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        mem.forget("key0")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert [k for k in (f"key{i}" for i in range(1, 10)) if mem.get(k) is None] == []


def test_a_stream_opens_its_chosen_backend_and_the_guard_fallback_only_when_needed(
        tmp_path: Path, package: ModelPackage) -> None:  # noqa: F811
    _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package))  # a first start
    sel, opened = _select(package, SPEEDS, {},
                          remembering=_remembering(tmp_path, package, keep=OPENED_AT_START))
    assert sel.remembered and sorted(opened) == ["litert"]  # the restart: the chosen one only
    reopened: list[str] = []

    def opener(package: AnyPackage, candidate: Candidate) -> Backend:
        reopened.append(candidate.label)
        fake: Backend = opened["litert"]  # any fake passing the golden check
        return fake

    kept, fallback = _guard_backends(package, sel, opener)
    assert [b.name for b in kept] == ["litert"] and fallback is not None and reopened == []
    guard = DeadlineGuard("s", kept, DegradeParams(0.01), Metrics(CollectorRegistry()),
                          fallback=fallback)
    assert guard.has_fallback and not guard.fallback_opened
    assert fallback().name == "litert" and reopened == ["openvino"]  # the next fastest


def test_a_selection_timed_here_keeps_its_loaded_fallback_and_closes_the_rest(
        package: ModelPackage) -> None:  # noqa: F811
    sel, opened = _select(package, SPEEDS, {})
    kept, fallback = _guard_backends(package, sel, lambda p, c: opened[c.label])
    assert [b.name for b in kept] == ["litert", "openvino"] and fallback is None
    assert opened["onnxruntime"].closed and opened["openvino-onnx"].closed
    assert not opened["litert"].closed and not opened["openvino"].closed


class _FailingRun:
    """A backend that loads, then fails its golden check with its runtime's own error."""

    name, precision, closed = "openvino", "int8", False

    def run(self, windows: object) -> object:
        raise RuntimeError("Exception from src/plugins/intel_cpu")

    def close(self) -> None:
        self.closed = True


def test_a_deferred_fallback_failing_its_check_with_any_error_is_closed(
        package: ModelPackage) -> None:  # noqa: F811
    sel, _ = _select(package, SPEEDS, {})
    failing = _FailingRun()
    open_now = deferred_open(package, sel.passing[1].candidate, lambda p, c: failing)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        open_now()
    assert failing.closed  # not left loaded (the guard goes on without it)
