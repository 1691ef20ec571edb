"""benchmarks/results.py: figures parsed from a benchmark's last line, the page rendered from the
record, and docs/results.md kept equal to what benchmarks/results.json renders."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "results.py"


def _results() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_results", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_results"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


RECORD = {"entries": [
    {"benchmark": "skab", "command": "python3 benchmarks/skab.py --data ../shared/datasets/skab",
     "date": "2026-12-01T10:00:00Z", "exit_code": 0, "last_line": "F1=0.825 FAR=11.01 MAR=22.81",
     "figures": {"F1": "0.825", "FAR": "11.01", "MAR": "22.81"},
     "machine": {"cpu": "AMD EPYC", "cores": 2, "cpu_flags": ["avx2", "avx512_vnni"],
                 "load_before": 0.5, "load_after": 1.1}},
    {"benchmark": "skab", "command": "python3 benchmarks/skab.py --data x", "date": "2026-11-29",
     "carried_over": True, "figures": {"F1": "0.800"}, "machine": {"cpu": "older CPU"},
     "note": "the FP32 twin: F1 0.790"},
    {"benchmark": "ims", "command": "python3 benchmarks/ims.py --data d", "exit_code": 1,
     "date": "2026-12-01T11:00:00Z", "last_line": "Traceback", "figures": {},
     "error": "FileNotFoundError: d", "machine": {"cpu": "AMD EPYC", "cores": 2}},
]}


def test_figures_are_the_key_value_pairs_of_the_last_line() -> None:
    r = _results()
    assert r.parse_figures("p50_ms=1.0 p99_ms=8.9 channel_readings_per_s=349573") == {
        "p50_ms": "1.0", "p99_ms": "8.9", "channel_readings_per_s": "349573"}
    assert r.parse_figures("scored 120 of 120 frames") == {}


def test_render_of_a_small_record() -> None:
    r = _results()
    page = r.render(RECORD)
    skab = page[page.index("## skab"):page.index("## ims")]
    # newest first, with machine, load, command and date
    assert skab.index("2026-12-01") < skab.index("2026-11-29 (carried over)")
    assert "`F1=0.825` `FAR=11.01` `MAR=22.81`" in skab
    assert "AMD EPYC, 2 cores, avx2 avx512_vnni, load 0.5 → 1.1" in skab
    assert "`python3 benchmarks/skab.py --data ../shared/datasets/skab`" in skab
    assert "| the FP32 twin: F1 0.790 |" in skab
    # a failed run shows its failure, not figures
    assert "failed (exit 1): FileNotFoundError: d" in page
    # benchmarks without an entry are listed with their command
    tail = page[page.index("## Not recorded yet"):]
    assert "`python3 benchmarks/camera.py`" in tail and "## skab" not in tail


def test_render_command_writes_the_page_from_the_record(tmp_path: Path) -> None:
    record, out = tmp_path / "results.json", tmp_path / "results.md"
    record.write_text(json.dumps(RECORD), encoding="utf-8")
    subprocess.run([sys.executable, str(SCRIPT), "--json", str(record), "--out", str(out),
                    "render"], check=True, timeout=60)
    assert out.read_text(encoding="utf-8") == _results().render(RECORD)


def test_committed_results_page_is_rendered_from_the_committed_record() -> None:
    r = _results()
    record = json.loads((ROOT / "benchmarks" / "results.json").read_text(encoding="utf-8"))
    assert (ROOT / "docs" / "results.md").read_text(encoding="utf-8") == r.render(record), (
        "docs/results.md is stale or edited by hand: `python3 benchmarks/results.py render`")
