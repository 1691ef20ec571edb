"""Backend registry and the LiteRT interpreter import (tflite-runtime under NumPy 2)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from agent.errors import BackendUnavailable, ModelError
from agent.inference.litert import load_interpreter_class, tflite_runtime_problem
from agent.inference.registry import backend_kinds, build_backend


def test_one_registry_line_per_runtime() -> None:
    assert backend_kinds() == ("litert", "onnxruntime", "openvino")


def test_unknown_backend() -> None:
    with pytest.raises(ModelError, match="unknown backend 'tensorrt'"):
        build_backend("tensorrt", Path("m.onnx"), "int8")


def test_missing_openvino_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    with pytest.raises(BackendUnavailable, match=r"pip install 'edge-anomaly-agent\[openvino\]'"):
        build_backend("openvino", Path("m.onnx"), "int8", threads=2, cache_dir=None)


@pytest.mark.parametrize(("tfl", "np_version", "bad"), [
    ("2.14.0", "2.4.6", True), ("2.13.1", "2.0.0", True), ("2.14.0", "1.26.4", False),
    ("2.16.1", "2.1.0", False), (None, "2.4.6", False)])
def test_tflite_runtime_numpy_check(tfl: str | None, np_version: str, bad: bool) -> None:
    assert (tflite_runtime_problem(tfl, np_version) is not None) == bad


class _Interp:
    pass


def _importer(modules: dict[str, object]):  # type: ignore[no-untyped-def]
    def imp(name: str) -> ModuleType:
        m = modules.get(name)
        if isinstance(m, BaseException):
            raise m
        if m is None:
            raise ImportError(name)
        return m  # type: ignore[return-value]
    return imp


def test_ai_edge_litert_first() -> None:
    cls = load_interpreter_class(
        _importer({"ai_edge_litert.interpreter": SimpleNamespace(Interpreter=_Interp)}),
        lambda d: None)
    assert cls is _Interp


def test_tflite_runtime_fallback_when_it_works() -> None:
    cls = load_interpreter_class(
        _importer({"tflite_runtime.interpreter": SimpleNamespace(Interpreter=_Interp)}),
        lambda d: "2.16.1")
    assert cls is _Interp


def test_old_tflite_runtime_under_numpy2_is_reported_not_imported() -> None:
    imported: list[str] = []

    def imp(name: str) -> ModuleType:
        imported.append(name)
        raise ImportError(name)

    with pytest.raises(BackendUnavailable, match="built for NumPy 1") as exc:
        load_interpreter_class(imp, lambda d: "2.14.0")
    assert "tflite_runtime.interpreter" not in imported
    assert "edge-anomaly-agent[litert]" in str(exc.value)


def test_a_tflite_runtime_failing_with_attribute_error_is_reported() -> None:
    with pytest.raises(BackendUnavailable, match="_ARRAY_API"):
        load_interpreter_class(
            _importer({"tflite_runtime.interpreter": AttributeError("_ARRAY_API not found")}),
            lambda d: None)


def test_nothing_installed_names_the_extra() -> None:
    with pytest.raises(BackendUnavailable, match=r"edge-anomaly-agent\[litert\]"):
        load_interpreter_class(_importer({}), lambda d: None)
