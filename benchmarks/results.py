"""Run selected benchmarks, record their figures, and render docs/results.md from the record.

    python3 benchmarks/results.py run --only skab,ims [--data ../shared/datasets] [--nice 10]
    python3 benchmarks/results.py run --only fleet_scale --args '--rows 10000000'  # reduced
    python3 benchmarks/results.py render                  # docs/results.md from results.json
    python3 benchmarks/results.py list                    # the benchmarks this script knows

``run`` starts each selected benchmark (:data:`BENCHMARKS`) as a subprocess under ``nice``,
captures its stdout and takes its **last line**, where every benchmark prints its figures as
``key=value`` pairs (e.g. ``F1=0.825 FAR=11.01 MAR=22.81``). One entry per run is appended to
``benchmarks/results.json``: the benchmark's name, the exact command, the date (UTC), the
machine (CPU model, logical cores, the int8-relevant CPU flags, the 1-minute load average
before and after), the wall time, the exit code, the last line and its figures. Then the page
is rendered again. ``render`` only rewrites the page, so the page is never edited by hand: a
test (tests/unit/test_benchmark_results.py) fails when docs/results.md differs from what the
record renders.

Entries with ``"carried_over": true`` were recorded before this script existed; they keep the
date, machine and command their figures were published with, and a ``note``.

A benchmark that fails (non-zero exit, or no ``key=value`` on its last line) is recorded with
its exit code and last line, not its figures, so a failure is visible and nothing is invented.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_JSON = ROOT / "benchmarks" / "results.json"
RESULTS_MD = ROOT / "docs" / "results.md"

#: CPU flags that decide int8 speed (VNNI, AMX) and are worth naming beside a figure.
INT8_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


@dataclass(frozen=True)
class Benchmark:
    """One benchmark script this runner knows.

    Attributes:
        name: Short name used by ``--only``.
        args: The command after ``python3``; ``{data}`` is replaced by the dataset root.
        measures: What it measures, one line for the page.
        target: The target it is held to, if any ("" = none).
        heavy: True when it keeps both cores busy for minutes or needs PostgreSQL; such
            benchmarks run only when named in ``--only``.
    """

    name: str
    args: tuple[str, ...]
    measures: str
    target: str = ""
    heavy: bool = False


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("skab", ("benchmarks/skab.py", "--data", "{data}/skab"),
              "SKAB published protocol, all 23 labelled files pooled: F1, FAR %, MAR % of the "
              "shipped INT8 sensor model", "F1 above the published detectors (0.78)"),
    Benchmark("ims", ("benchmarks/ims.py", "--data", "{data}/ims_bearing"),
              "IMS bearing run-to-failure (test 2): first alarm and alarms in the healthy part",
              "first alarm days before the 2004-02-19 failure, no healthy-part alarm"),
    Benchmark("mtd", ("benchmarks/mtd.py", "--data", "{data}/mtd"),
              "MTD magnetic tiles: image AUROC of the shipped INT8 camera model",
              "AUROC >= 0.95"),
    Benchmark("inference", ("benchmarks/inference.py",),
              "every installed runtime x INT8/FP32 x threads x batch: batch-1 speedup of the "
              "selected INT8 backend over ONNX Runtime FP32 and PyTorch FP32",
              "int8_vs_ort_fp32 >= 3, int8_vs_torch >= 5", heavy=True),
    Benchmark("latency", ("benchmarks/latency.py",),
              "read -> alert delivered to a subscriber on a real mosquitto (10,000 alerts); "
              "channel-readings/s end to end", "p99 read -> alert <= 2 ms", heavy=True),
    Benchmark("ingest", ("benchmarks/ingest.py",),
              "read -> alert p99 per source kind (Modbus, OPC UA, MQTT in); CPU per register",
              "p99 at most 5 ms over direct; 100 registers at 10 Hz < 5 % of one core",
              heavy=True),
    Benchmark("camera", ("benchmarks/camera.py",),
              "4 cameras x 30 fps of 128x128 MJPG: frame -> score p99", "p99 <= 20 ms",
              heavy=True),
    Benchmark("memory", ("benchmarks/memory.py", "--data", "{data}"),
              "agent resident memory (VmRSS steady, VmHWM peak) with one sensor stream and "
              "with 4 camera streams, every runtime installed",
              "<= 120 MB one sensor stream, <= 250 MB 4 cameras", heavy=True),
    Benchmark("backlog", ("benchmarks/backlog.py",),
              "1,000,000 buffered aggregates drained into a real fleet (SQLite, 2 workers)",
              "50,000 rows/s", heavy=True),
    Benchmark("fleet_ingest", ("benchmarks/fleet_ingest.py",),
              "200 devices, one 50-record batch each every 2 s, 2 workers, PostgreSQL",
              "p99 <= 100 ms", heavy=True),
    Benchmark("skab_loop", ("benchmarks/skab_loop.py", "--data", "{data}/skab"),
              "SKAB through the closed loop (fleet retrains, signs and rolls out per device)",
              heavy=True),
    Benchmark("univariate_generated", ("benchmarks/univariate_generated.py",),
              "the shipped univariate package on generated series (noise, daily sine, trend, "
              "heavy tails, random walk, irregular times with gaps) with 8 sigma spikes of 1 and "
              "3 rows and 4 sigma steps of 50 rows: hit rates, false alarms, time in alarm",
              "hit rates >= 0.9, false alarms <= 1 per 10,000 rows", heavy=True),
    Benchmark("fleet_hostile_bodies", ("benchmarks/fleet_hostile_bodies.py",),
              "fleet memory under large unauthenticated bodies", heavy=True),
    Benchmark("console_scale", ("benchmarks/console_scale.py",),
              "the console's routes on PostgreSQL with 1,000 devices and 10 million aggregates "
              "(loads them first: minutes)", "p99 < 200 ms", heavy=True),
    Benchmark("fleet_scale", ("benchmarks/fleet_scale.py",),
              "simulated devices (batch, health, assignment poll a minute each) on 2 replicas "
              "+ PostgreSQL; console queries on a generated partitioned aggregates table; a "
              "retraining burst drained by 2 workers",
              "p99 <= 100 ms at 10,000 devices; query p99 <= 200 ms at 100 M rows; no job lost "
              "or duplicated", heavy=True),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


def parse_figures(line: str) -> dict[str, str]:
    """The ``key=value`` pairs of a benchmark's last line, in order.

    >>> parse_figures("F1=0.825 FAR=11.01 MAR=22.81")
    {'F1': '0.825', 'FAR': '11.01', 'MAR': '22.81'}
    >>> parse_figures("no figures here")
    {}
    """
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep and key and value:
            out[key] = value
    return out


def machine() -> dict[str, Any]:
    """The machine a run happens on: CPU model, logical cores, int8 CPU flags, load, Python."""
    model, flags = platform.processor() or platform.machine(), set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(),
                                                          platform.processor()):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "cpu_flags": [f for f in INT8_FLAGS if f in flags],
        "python": platform.python_version(),
    }


def _relative(path: str) -> str:
    """``path`` relative to the checkout when it is below the checkout's parent, as the docs
    write the dataset root (``../shared/datasets``); else as given."""
    absolute = Path(path).resolve()
    if absolute.is_relative_to(ROOT.parent):
        return os.path.relpath(absolute, ROOT)
    return path


def run_one(bench: Benchmark, data: str, nice: int, timeout_s: float,
            extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run one benchmark from the checkout's root and return its record entry; ``extra`` is
    appended to its arguments (and to the recorded command)."""
    argv = [a.replace("{data}", data) for a in (*bench.args, *extra)]
    shown = [a.replace("{data}", _relative(data)) for a in (*bench.args, *extra)]
    command = "python3 " + " ".join(shlex.quote(a) for a in shown)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(["nice", "-n", str(nice), sys.executable, *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout_s, env=env,
                              check=False)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = -1
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = f"timed out after {timeout_s:.0f} s"
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    figures = parse_figures(last) if code == 0 else {}
    entry: dict[str, Any] = {
        "benchmark": bench.name,
        "command": command,
        "date": date,
        "machine": {**machine(), "load_before": round(load_before, 2),
                    "load_after": round(os.getloadavg()[0], 2)},
        "seconds": round(time.monotonic() - started, 1),
        "exit_code": code,
        "last_line": last,
        "figures": figures,
    }
    if code != 0 or not figures:
        reasons = stderr.strip().splitlines() or ["no key=value figures on the last line"]
        entry["error"] = reasons[-1]
    return entry


def load(path: Path) -> dict[str, Any]:
    """The record file (``{"entries": [...]}``; an absent file is an empty record)."""
    if not path.exists():
        return {"entries": []}
    record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return record


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _machine_text(m: dict[str, Any]) -> str:
    parts = [str(m.get("cpu", "unknown CPU"))]
    if m.get("cores"):
        parts.append(f"{m['cores']} cores")
    if m.get("cpu_flags"):
        parts.append(" ".join(m["cpu_flags"]))
    if "load_before" in m:
        parts.append(f"load {m['load_before']} → {m.get('load_after', '?')}")
    if m.get("note"):
        parts.append(str(m["note"]))
    return ", ".join(parts)


def render(record: dict[str, Any], benchmarks: tuple[Benchmark, ...] = BENCHMARKS) -> str:
    """docs/results.md from a record: per benchmark, every entry newest first.

    Args:
        record: ``{"entries": [...]}`` as :func:`run_one` writes them (or carried over).
        benchmarks: The known benchmarks, in page order; entries of other names follow.

    Returns:
        The Markdown page, ending with one newline.
    """
    entries: list[dict[str, Any]] = list(record.get("entries", []))
    names = [b.name for b in benchmarks]
    names += sorted({e["benchmark"] for e in entries} - set(names))
    out = [
        "# Benchmark results",
        "",
        "<!-- Generated by `python3 benchmarks/results.py render` from benchmarks/results.json;",
        "     do not edit by hand (tests/unit/test_benchmark_results.py fails when it is",
        "     stale). -->",
        "",
        "Every figure here was printed by the benchmark named, on the machine named, on the date",
        "given; `python3 benchmarks/results.py run --only NAME` runs a benchmark again and",
        "records a new entry. None of them is a timed test. The figures depend on the CPU's",
        "int8 units (VNNI, AMX) and on the other load of the machine more than on anything",
        "else. What each benchmark does and how to read it: [benchmarks.md](benchmarks.md).",
        "",
    ]
    not_run: list[str] = []
    for name in names:
        bench = BY_NAME.get(name)
        mine = sorted((e for e in entries if e["benchmark"] == name),
                      key=lambda e: str(e.get("date", "")), reverse=True)
        if not mine:
            if bench is not None:
                not_run.append(f"| `{name}` | `python3 {' '.join(bench.args)}` | "
                               f"{_cell(bench.measures)} |")
            continue
        out += [f"## {name}", ""]
        if bench is not None:
            out.append(bench.measures + (f". Target: {bench.target}." if bench.target else "."))
            out.append("")
        out += ["| date | figures | machine | command | notes |",
                "| --- | --- | --- | --- | --- |"]
        for e in mine:
            if e.get("figures"):
                figures = " ".join(f"`{k}={v}`" for k, v in e["figures"].items())
            else:
                why = e.get("error", e.get("last_line"))
                figures = f"failed (exit {e.get('exit_code')}): {why}"
            date = str(e.get("date", ""))[:10]
            if e.get("carried_over"):
                date += " (carried over)"
            out.append(f"| {date} | {_cell(figures)} | {_cell(_machine_text(e.get('machine', {})))}"
                       f" | `{_cell(e.get('command', ''))}` | {_cell(e.get('note', ''))} |")
        out.append("")
    if not_run:
        out += ["## Not recorded yet", "",
                "| benchmark | command | measures |", "| --- | --- | --- |", *not_run, ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, default=RESULTS_JSON, help="the record file")
    parser.add_argument("--out", type=Path, default=RESULTS_MD, help="the page to render")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run benchmarks, record, render")
    run.add_argument("--only", required=True,
                     help="comma-separated names (see `list`); `cheap` = every non-heavy one")
    run.add_argument("--data", default=str(ROOT.parent / "shared" / "datasets"),
                     help="the dataset root (default ../shared/datasets)")
    run.add_argument("--nice", type=int, default=10, help="niceness of the benchmarks (10)")
    run.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    run.add_argument("--args", default="", metavar="'ARGS'",
                     help="extra arguments of ONE benchmark (e.g. a reduced scale: "
                     "--only fleet_scale --args '--rows 10000000'); recorded in its command")
    sub.add_parser("render", help="render the page from the record only")
    sub.add_parser("list", help="list the benchmarks")
    args = parser.parse_args(argv)

    if args.command == "list":
        for b in BENCHMARKS:
            print(f"{b.name:22} {'heavy' if b.heavy else 'cheap'}  python3 {' '.join(b.args)}")
        return 0
    record = load(args.json)
    if args.command == "run":
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        if names == ["cheap"]:
            names = [b.name for b in BENCHMARKS if not b.heavy]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            parser.error(f"unknown benchmark(s) {unknown}; known: {sorted(BY_NAME)}")
        extra = tuple(shlex.split(args.args))
        if extra and len(names) != 1:
            parser.error("--args needs exactly one benchmark in --only")
        for name in names:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            entry = run_one(BY_NAME[name], args.data, args.nice, args.timeout, extra)
            print(f"{name}: {entry['last_line']}", file=sys.stderr, flush=True)
            record["entries"].append(entry)
            args.json.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n",
                                 encoding="utf-8")
    args.out.write_text(render(record), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
