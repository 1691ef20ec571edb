"""A first backend selection timed in a child process (agent.inference.rank_child): the agent
opens only the candidates it keeps, remembers the child's ranking, lists the child's failures,
and times the candidates itself when the ranker fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import ModelError
from agent.inference.choice_memory import ChoiceMemory, selection_key
from agent.inference.package import ModelPackage
from agent.inference.rank_child import parse_answer, run_child
from agent.inference.select import AnyPackage, RankedTrial, Remembering
from tests.unit.test_backend_select import SPEEDS, _select, package  # noqa: F401 - fixture

ROOT = Path(__file__).resolve().parents[2]


def _remembering(tmp_path: Path, pkg: ModelPackage) -> Remembering:
    return Remembering(ChoiceMemory.in_state_dir(tmp_path), selection_key(pkg, "auto", "int8", 1),
                       keep=2)


class _Ranker:
    def __init__(self, rows: list[RankedTrial] | None) -> None:
        self.rows = rows
        self.calls: list[tuple[str, str, int, int]] = []

    def __call__(self, pkg: AnyPackage, backend: str, precision: str, runs: int,
                 warmup: int) -> list[RankedTrial] | None:
        self.calls.append((backend, precision, runs, warmup))
        return self.rows


def _rows(pkg: ModelPackage) -> list[RankedTrial]:
    path = {a.runtime: a.path for a in pkg.manifest.artefacts if a.precision == "int8"
            and not a.path.endswith(".bin")}
    return [("litert", path["litert"], 1e-5, None),
            ("openvino", path["openvino"], 2e-5, None),
            ("onnxruntime", path["onnxruntime"], 3e-5, None),
            ("openvino", path["onnxruntime"], None, "golden outputs differ")]


def test_the_childs_ranking_is_remembered_and_only_its_first_candidates_open(
        tmp_path: Path, package: ModelPackage) -> None:  # noqa: F811
    ranker = _Ranker(_rows(package))
    sel, opened = _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package),
                          ranker=ranker)
    assert ranker.calls == [("auto", "int8", 20, 3)]
    assert sorted(opened) == ["litert", "openvino"]  # the two kept; the others never opened
    assert sel.apart and not sel.remembered and sel.chosen.candidate.label == "litert"
    assert [(t.candidate.label, t.error) for t in sel.trials] == [
        ("litert", None), ("openvino", None), ("onnxruntime", None),
        ("openvino-onnx", "golden outputs differ")]
    assert len(sel.backends) == 2
    stored = ChoiceMemory.in_state_dir(tmp_path).get(selection_key(package, "auto", "int8", 1))
    assert stored is not None and [k for k, _, _ in stored] == ["litert", "openvino",
                                                                 "onnxruntime"]
    again, opened = _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package),
                            ranker=ranker)
    assert again.remembered and len(ranker.calls) == 1  # a restart asks no child


def test_a_failed_ranker_means_timing_here(tmp_path: Path, package: ModelPackage) -> None:  # noqa: F811
    sel, opened = _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package),
                          ranker=_Ranker(None))
    assert not sel.apart and len(opened) == 4 and opened["litert"].calls > 3


def test_a_kept_candidate_that_fails_here_means_timing_here(
        tmp_path: Path, package: ModelPackage) -> None:  # noqa: F811
    sel, opened = _select(package, SPEEDS, {"litert": 1.0},
                          remembering=_remembering(tmp_path, package),
                          ranker=_Ranker(_rows(package)))
    assert not sel.apart and sel.chosen.candidate.label == "openvino" and len(opened) == 4


def test_nothing_passing_in_the_child_is_a_model_error_with_its_reasons(
        tmp_path: Path, package: ModelPackage) -> None:  # noqa: F811
    rows: list[RankedTrial] = [(k, p, None, "does not load") for k, p, _, _ in _rows(package)]
    sel, opened = _select(package, SPEEDS, {}, remembering=_remembering(tmp_path, package),
                          ranker=_Ranker(rows))
    assert not opened
    with pytest.raises(ModelError, match=r"no backend passed: .*does not load"):
        _ = sel.chosen


@pytest.mark.parametrize("text", ["", "{}", '[["litert", "m", 1.0, "both"]]',
                                  '[["litert", "m", null, null]]', '[["litert", "m", 1.0]]',
                                  '[["litert", "m", NaN, null]]', '[["litert", "m", -1.0, null]]',
                                  '[["litert", "m", Infinity, null]]',
                                  '[["litert", "m", true, null]]'])
def test_a_garbage_answer_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_answer(text)


def test_the_real_child_ranks_the_shipped_model() -> None:
    pytest.importorskip("onnxruntime")
    rows = run_child({"package": str(ROOT / "models" / "skab-wstat"), "image": False,
                      "backend": "onnxruntime", "precision": "int8", "threads": 1,
                      "cache_dir": None, "runs": 3, "warmup": 1}, 120.0, "skab-wstat")
    assert rows is not None and rows[0][:2] == ("onnxruntime", "model.int8.onnx")
    assert rows[0][2] is not None and rows[0][2] > 0 and rows[0][3] is None


AGENT_SIDE = """
import sys
from pathlib import Path
from agent.errors import ModelError
from agent.inference.choice_memory import ChoiceMemory, selection_key
from agent.inference.package import load_package
from agent.inference.rank_child import child_ranker
from agent.inference.select import Remembering, registry_opener, select_backend
pkg = load_package(Path(sys.argv[1]))
rem = Remembering(ChoiceMemory.in_state_dir(Path(sys.argv[2])),
                  selection_key(pkg, "auto", "int8", 1), keep=1)
sel = select_backend(pkg, opener=registry_opener(), remembering=rem, ranker=child_ranker(),
                     runs=3, warmup=1)
runtimes = ("onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime")
print(sel.apart, len(sel.trials), sel.chosen.candidate.kind,
      ",".join(m for m in runtimes if m in sys.modules))
"""


def test_the_agent_imports_only_the_chosen_runtime(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    done = subprocess.run([sys.executable, "-c", AGENT_SIDE, str(ROOT / "models" / "skab-wstat"),
                           str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          check=True, timeout=300)
    apart, trials, chosen, imported = done.stdout.split()
    assert apart == "True" and int(trials) >= 1
    module = {"litert": "ai_edge_litert"}.get(chosen, chosen)
    assert imported == module or (chosen == "litert" and imported == "tflite_runtime")


def test_a_child_that_fails_is_none_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    rows = run_child({"package": "/nonexistent", "image": False, "backend": "auto",
                      "precision": "int8", "threads": 1, "cache_dir": None, "runs": 1,
                      "warmup": 0}, 120.0, "missing")
    assert rows is None and "exited with status 1" in caplog.text


def test_the_child_keeps_its_stdout_for_the_answer() -> None:
    """A runtime printing to stdout while loading lands on stderr, not in the answer."""
    code = ("import os, sys; from agent.inference import rank_child as r;"
            "r.select_backend = lambda *a, **k: (os.write(1, b'noise\\n'), sys.exit(3))[1];"
            "r.main()")
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(
        {"package": str(ROOT / "models" / "skab-wstat"), "image": False, "backend": "auto",
         "precision": "int8", "threads": 1, "cache_dir": None, "runs": 1, "warmup": 0}),
        text=True,
        capture_output=True, cwd=ROOT, check=False)
    assert done.returncode == 3 and done.stdout == "" and "noise" in done.stderr


def test_the_childs_ranking_is_used_when_the_state_dir_cannot_be_written(
        tmp_path: Path, package: ModelPackage) -> None:  # noqa: F811
    """Full disk or unwritable state directory: the ranking is not remembered, but the child's
    work is still used (only its first candidates open), not thrown away for a full in-process
    timing that imports every runtime."""
    blocked = tmp_path / "state"
    blocked.write_text("a file where the state directory should be")  # mkdir fails, even as root
    rem = Remembering(ChoiceMemory.in_state_dir(blocked / "sub"),
                      selection_key(package, "auto", "int8", 1), keep=2)
    sel, opened = _select(package, SPEEDS, {}, remembering=rem, ranker=_Ranker(_rows(package)))
    assert sel.apart and sel.chosen.candidate.label == "litert"
    assert sorted(opened) == ["litert", "openvino"]
    assert rem.memory.get(rem.key) is None  # nothing remembered: the next start asks again


def test_a_child_writing_bytes_that_are_not_utf8_is_none_and_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The child's stdout is not trusted to be text: undecodable bytes (a site hook, a library
    writing before the child took its stdout) mean "time here", not an agent that crashes."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.write(1, b'\\xff\\xfe garbage\\n')\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    pytest.importorskip("onnxruntime")
    rows = run_child({"package": str(ROOT / "models" / "skab-wstat"), "image": False,
                      "backend": "onnxruntime", "precision": "int8", "threads": 1,
                      "cache_dir": None, "runs": 1, "warmup": 0}, 120.0, "garbled")
    assert rows is None and "model garbled: the runtime-ranking child answered garbage" in (
        caplog.text)


def test_a_child_killed_by_a_signal_is_none_and_logged_by_the_signals_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """SIGKILL (the OOM killer, an operator) reads as such, not as "exited with status -9"."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os, signal\nos.kill(os.getpid(), "
                                           "signal.SIGKILL)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    rows = run_child({"package": "/nonexistent", "image": False, "backend": "auto",
                      "precision": "int8", "threads": 1, "cache_dir": None, "runs": 1,
                      "warmup": 0}, 120.0, "killed")
    assert rows is None and "model killed: the runtime-ranking child was killed by SIGKILL" in (
        caplog.text)


def test_progress_is_reported_while_the_child_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent asks systemd for more start-up time from ``progress``: a child longer than
    one start step must not get the agent killed before the child's own timeout. This child
    waits for the first ``progress`` call before it ranks."""
    pytest.importorskip("onnxruntime")
    site, flag = tmp_path / "site", tmp_path / "progressed"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, time\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.05)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    calls: list[int] = []

    def progress() -> None:
        calls.append(1)
        flag.touch()

    rows = run_child({"package": str(ROOT / "models" / "skab-wstat"), "image": False,
                      "backend": "onnxruntime", "precision": "int8", "threads": 1,
                      "cache_dir": None, "runs": 1, "warmup": 0}, 120.0, "slow",
                     progress=progress, progress_s=0.2)
    assert calls and rows is not None and rows[0][:2] == ("onnxruntime", "model.int8.onnx")


def test_a_hung_child_is_killed_and_reaped_at_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    site, pid_file = tmp_path / "site", tmp_path / "child.pid"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(3600)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    fds = len(os.listdir("/proc/self/fd"))
    rows = run_child({"package": "/nonexistent", "image": False, "backend": "auto",
                      "precision": "int8", "threads": 1, "cache_dir": None, "runs": 1,
                      "warmup": 0}, 1.0, "hung", progress=lambda: None, progress_s=0.2)
    assert rows is None and len(os.listdir("/proc/self/fd")) == fds  # no pipe left open
    assert "model hung: the runtime-ranking child gave no answer within 1 s" in caplog.text
    with pytest.raises(ProcessLookupError):  # killed and waited for: not even a zombie
        os.kill(int(pid_file.read_text()), 0)


def test_the_child_runs_this_agent_package_whatever_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m`` puts the working directory first on the child's path: an ``agent``
    folder there (a checkout of another version) must not be what the child runs."""
    pytest.importorskip("onnxruntime")
    shadow = tmp_path / "agent"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("import sys\nsys.exit(7)\n")
    monkeypatch.chdir(tmp_path)
    rows = run_child({"package": str(ROOT / "models" / "skab-wstat"), "image": False,
                      "backend": "onnxruntime", "precision": "int8", "threads": 1,
                      "cache_dir": None, "runs": 1, "warmup": 0}, 120.0, "shadowed")
    assert rows is not None and rows[0][:2] == ("onnxruntime", "model.int8.onnx")
