"""OpenVINO backend settings reach the compiled model (CPU plugin properties)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.inference.openvino import OpenVinoBackend, OpenVinoConfig

pytest.importorskip("openvino")

IR = Path(__file__).resolve().parents[2] / "models" / "skab-wstat" / "model.int8.xml"
#: The shipped package's window (the IR's fixed input length).
WINDOW = json.loads((IR.parent / "manifest.json").read_text())["input"]["window"]


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


def test_an_unusable_cache_dir_compiles_without_cache(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file where the cache directory should be (or an unwritable state dir) raised
    FileExistsError out of the backend: a traceback at start. Now one WARNING, no cache."""
    blocked = tmp_path / "openvino-cache"
    blocked.write_text("in the way")
    with caplog.at_level("WARNING", logger="agent.inference"):
        first = OpenVinoBackend(IR, "int8", OpenVinoConfig(cache_dir=blocked))
        second = OpenVinoBackend(IR, "int8", OpenVinoConfig(cache_dir=blocked))
    assert first.cache_dir is None and second.cache_dir is None
    assert first.run(np.zeros((1, WINDOW, 8), np.float32)).shape[0] == 1
    warnings = [r.getMessage() for r in caplog.records if "not usable" in r.getMessage()]
    assert len(warnings) == 1 and str(blocked) in warnings[0]


def test_models_freed_out_of_order_leave_signals_working() -> None:
    """OpenVINO leaves the thread on a freed alternate signal stack when compiled models are
    freed in creation order (two candidates failing the golden check: a camera stream's
    OpenVINO IR and ONNX on an AVX2 CPU); SIGTERM then killed the agent with SIGSEGV (exit
    139) instead of a clean stop. Run in a child: the failure is a crash."""
    code = f"""
import gc, os, signal
import subprocess
import sys
from pathlib import Path
from agent.inference.openvino import OpenVinoBackend
signal.signal(signal.SIGTERM, lambda s, f: print("handled", flush=True))
a = OpenVinoBackend(Path({str(IR)!r}), "int8")
b = OpenVinoBackend(Path({str(IR)!r}), "int8")
del a; gc.collect()
del b; gc.collect()
os.kill(os.getpid(), signal.SIGTERM)
print("alive", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["handled", "alive"]
