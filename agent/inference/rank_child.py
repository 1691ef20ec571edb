"""Backend ranking in a short-lived child process, so the agent imports only what it keeps.

A first selection (:func:`agent.inference.select.select_backend`) loads every installed runtime
to time it, and a runtime's native libraries cannot be unloaded once imported: measured with
``benchmarks/memory.py``, one sensor stream held 184 MB after a first start against 121 MB
after a restart that opened only the runtimes it kept. :func:`child_ranker` runs the timing in
a child (``python -m agent.inference.rank_child``, this interpreter and this ``agent``
package): the child loads the package from its folder again (hashes checked), runs the same
selection (load, golden check, warm-up, p50 of one input per candidate) and writes one JSON
line, ``[[kind, artefact path, p50 seconds or null, error or null], ...]``, passing candidates
fastest first. The agent then remembers that ranking and opens only its first candidates,
each golden-checked again (the restart's path, :mod:`agent.inference.choice_memory`).

Protocol: the request is one JSON object on the child's stdin (``package``: the package folder;
``image``: an image package; ``backend``, ``precision``, ``threads``, ``cache_dir`` (or null),
``runs``, ``warmup``); the answer is the child's stdout (the child points file descriptor 1 at
its stderr while runtimes are loaded, so a runtime printing to stdout cannot corrupt it);
runtime messages go to the agent's stderr. The child leaves with ``os._exit`` once the answer
is written (no runtime teardown). A child that exits nonzero, is killed, times out
(:data:`TIMEOUT_S`; it is then killed and reaped) or answers garbage makes :func:`child_ranker`
return None: the caller then times the candidates in-process, as before. While the child runs,
the agent extends its systemd start-up timeout every :data:`PROGRESS_S` seconds (``progress``),
so a slow or hung child ends at :data:`TIMEOUT_S` and the agent falls back, instead of systemd
killing the whole start after one start step (120 s) and restarting into the same child.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import agent
from agent.errors import AgentError
from agent.inference.image_package import ImagePackage, load_image_package
from agent.inference.package import load_package
from agent.inference.select import AnyPackage, RankedTrial, Ranker, registry_opener, select_backend

log = logging.getLogger("agent.inference")

#: Longest a child may take for one package, seconds (every runtime loads, compiles and is
#: timed in it: a few seconds for the shipped models on a 2-core gateway).
TIMEOUT_S = 900.0
#: Seconds between two calls of :func:`child_ranker`'s ``progress`` while a child runs.
PROGRESS_S = 10.0


def child_ranker(threads: int = 1, cache_dir: Path | None = None,
                 timeout_s: float = TIMEOUT_S,
                 progress: Callable[[], None] | None = None) -> Ranker:
    """A :class:`agent.inference.select.Ranker` timing the candidates in a child process with
    these runtime settings (the same as :func:`agent.inference.select.registry_opener`'s).

    ``progress`` is called every :data:`PROGRESS_S` seconds while the child runs: the agent
    extends its systemd start timeout there (and pings the watchdog during a reload), so that
    :data:`TIMEOUT_S`, not systemd, ends a child that hangs."""

    def rank(package: AnyPackage, backend: str, precision: str, runs: int,
             warmup: int) -> list[RankedTrial] | None:
        # absolute: the child runs in the folder holding the agent package (_agent_root)
        request = {"package": str(package.path.absolute()),
                   "image": isinstance(package, ImagePackage),
                   "backend": backend, "precision": precision, "threads": threads,
                   "cache_dir": None if cache_dir is None else str(cache_dir.absolute()),
                   "runs": runs, "warmup": warmup}
        return run_child(request, timeout_s, package.label, progress)

    return rank


def _agent_root() -> str:
    """The folder holding this ``agent`` package."""
    return str(Path(agent.__file__).resolve().parents[1])


def _child_env() -> dict[str, str]:
    """This environment with the folder holding the ``agent`` package first on PYTHONPATH."""
    env = dict(os.environ)
    root = _agent_root()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):  # the agent talks to systemd
        env.pop(key, None)
    return env


def run_child(request: dict[str, Any], timeout_s: float, label: str,
              progress: Callable[[], None] | None = None,
              progress_s: float | None = None) -> list[RankedTrial] | None:
    """Run the child on ``request``; its ranking, or None (logged at WARNING) when it failed.

    ``progress`` is called every ``progress_s`` seconds (default :data:`PROGRESS_S`) while the
    child runs (the agent tells systemd that its start goes on: a child may outlast one start
    step). A child still running at ``timeout_s``, or when this call ends on an exception (a
    stop signal), is killed and reaped.
    """
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "agent.inference.rank_child"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=None, env=_child_env(),
            cwd=_agent_root())  # ``-m`` puts the working directory first on the child's path
    except OSError as exc:
        log.warning("model %s: ranking the runtimes in a child process failed (%s); timing "
                    "them in the agent", label, exc)
        return None
    step = PROGRESS_S if progress_s is None else progress_s
    deadline = time.monotonic() + timeout_s
    data: bytes | None = json.dumps(request).encode()
    try:
        while True:
            try:  # bytes: the answer is decoded below, never trusted as text
                out, _ = child.communicate(
                    data, timeout=max(0.0, min(step, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                data = None  # written already (communicate goes on where it stopped)
                if time.monotonic() >= deadline:
                    log.warning("model %s: the runtime-ranking child gave no answer within "
                                "%.0f s; killed, timing the runtimes in the agent", label,
                                timeout_s)
                    return None
                if progress is not None:
                    progress()
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("model %s: ranking the runtimes in a child process failed (%s); timing "
                    "them in the agent", label, exc)
        return None
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):  # closed already unless the wait was cut short
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
    if child.returncode != 0:
        how = (f"was killed by {_signal_name(-child.returncode)}" if child.returncode < 0
               else f"exited with status {child.returncode}")
        log.warning("model %s: the runtime-ranking child %s; timing the runtimes in the agent",
                    label, how)
        return None
    try:
        return parse_answer(out.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError included
        log.warning("model %s: the runtime-ranking child answered garbage (%s); timing the "
                    "runtimes in the agent", label, exc)
        return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def parse_answer(text: str) -> list[RankedTrial]:
    """The child's answer as ``(kind, path, p50 or None, error or None)`` tuples.

    >>> parse_answer('[["litert", "m.tflite", 1.5e-05, null], ["openvino", "m.xml", null, "x"]]')
    [('litert', 'm.tflite', 1.5e-05, None), ('openvino', 'm.xml', None, 'x')]

    Raises:
        ValueError: not a JSON list of such rows, a row with neither or both of p50 and error,
            or a p50 that is not a finite number of seconds (``NaN``, negative, a boolean).
    """
    rows = json.loads(text)
    if not isinstance(rows, list):
        raise ValueError("not a list")
    out: list[RankedTrial] = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4):
            raise ValueError(f"bad row {row!r}")
        kind, path, p50, error = row
        ok = (isinstance(p50, int | float) and not isinstance(p50, bool)
              and math.isfinite(p50) and p50 >= 0 and error is None)
        failed = p50 is None and isinstance(error, str)
        if not (isinstance(kind, str) and isinstance(path, str) and (ok or failed)):
            raise ValueError(f"bad row {row!r}")
        out.append((kind, path, None if p50 is None else float(p50), error))
    return out


def main() -> None:
    """The child: read the request on stdin, write the ranking on stdout, ``os._exit``."""
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a runtime writing to stdout must not corrupt the answer
    try:
        req = json.loads(sys.stdin.read())
        folder = Path(req["package"])
        package: AnyPackage = (load_image_package(folder) if req["image"]
                               else load_package(folder))
        cache = None if req["cache_dir"] is None else Path(req["cache_dir"])
        selection = select_backend(
            package, req["backend"], req["precision"],
            opener=registry_opener(int(req["threads"]), cache),
            runs=int(req["runs"]), warmup=int(req["warmup"]))
        rows = [[t.candidate.kind, t.candidate.artefact.path, t.p50_s, t.error]
                for t in selection.trials]
        answer.write(json.dumps(rows) + "\n")
        answer.flush()
    except (AgentError, OSError, ValueError, KeyError, TypeError) as exc:
        print(f"rank_child: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)  # no runtime teardown: the process ends here


if __name__ == "__main__":
    main()
