"""Camera streams on one image model select its backend once (open_image_backend ``choices``);
the candidates not chosen are closed."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from agent.errors import ModelError
from agent.inference.image_package import load_image_package
from agent.inference.image_select import ImageChoices, open_image_backend
from agent.inference.onnxruntime import OnnxRuntimeBackend
from agent.inference.openvino import OpenVinoBackend
from agent.inference.select import golden_window, select_backend

MODEL = Path(__file__).resolve().parents[2] / "models" / "mtd-patchcore"


def test_a_second_stream_of_the_model_opens_the_chosen_candidate_only(
        caplog: pytest.LogCaptureFixture) -> None:
    package = load_image_package(MODEL)
    choices: ImageChoices = {}
    with caplog.at_level(logging.INFO, "agent.inference"):
        first = open_image_backend(package, choices=choices)
        assert "selected (p50 of one image)" in caplog.text
        caplog.clear()
        second = open_image_backend(package, choices=choices)
    assert list(choices) == [(str(package.path), "int8", "auto")]
    assert second is not first and second.name == first.name  # its own instance
    assert "chosen for another stream" in caplog.text and "selected" not in caplog.text
    first.close()
    with pytest.raises(ModelError, match="closed"):
        first.run(golden_window(package))
    assert second.run(golden_window(package)).shape[0] == 1


def test_closed_backends_refuse_to_run() -> None:
    package = load_image_package(MODEL)
    selection = select_backend(package, runs=2, warmup=1)
    x = golden_window(package)
    for backend in selection.backends:
        backend.close()
        backend.close()  # again: nothing
        with pytest.raises(ModelError, match="closed"):
            backend.run(x)


def test_cameras_on_one_onnxruntime_model_share_its_session() -> None:
    package = load_image_package(MODEL)
    choices: ImageChoices = {}
    first = open_image_backend(package, backend="onnxruntime", choices=choices)
    second = open_image_backend(package, backend="onnxruntime", choices=choices)
    assert isinstance(first, OnnxRuntimeBackend) and isinstance(second, OnnxRuntimeBackend)
    assert second is not first and second._session is first._session  # one session
    x = golden_window(package)
    before = first.run(x)
    first.close()  # the other handle keeps the session
    assert np.array_equal(second.run(x), before)
    with pytest.raises(ModelError, match="closed"):
        first.share()
    third = open_image_backend(package, backend="onnxruntime", choices=choices)
    assert isinstance(third, OnnxRuntimeBackend)
    assert third._session is not second._session  # the first was closed: a new session


def test_cameras_on_one_openvino_model_share_its_compiled_model() -> None:
    pytest.importorskip("openvino")
    package = load_image_package(MODEL)
    choices: ImageChoices = {}
    opened = [open_image_backend(package, backend="openvino", choices=choices, streams=2)
              for _ in range(3)]
    first, second, third = opened
    assert all(isinstance(b, OpenVinoBackend) for b in opened)
    assert isinstance(first, OpenVinoBackend) and isinstance(second, OpenVinoBackend)
    assert isinstance(third, OpenVinoBackend)
    assert second._compiled is first._compiled  # one compiled model ...
    assert second._request is not first._request  # ... an infer request each
    assert third._compiled is not first._compiled  # its 2 streams taken: another instance
    x = golden_window(package)
    alone = first.run(x)
    together: list[np.ndarray] = []
    runs = [threading.Thread(target=lambda b=b: together.append(b.run(x)))
            for b in (first, second) for _ in range(3)]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    assert len(together) == 6 and all(np.array_equal(r, alone) for r in together)
    first.close()  # the other handle keeps the compiled model
    assert np.array_equal(second.run(x), alone)
    with pytest.raises(ModelError, match="closed"):
        first.share()
    for b in (second, third):
        b.close()
