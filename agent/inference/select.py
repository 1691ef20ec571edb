"""Backend auto-selection at model activation: benchmark, check, pick the fastest that passes.

For a stream configured with ``backend = "auto"``, every installed runtime is tried on every
artefact it can run at the configured precision (:func:`candidates`: ONNX Runtime on the ONNX
artefact, OpenVINO on its IR and on the ONNX artefact, LiteRT on the TFLite artefact). Each
candidate is loaded, must reproduce the package's golden vectors within their tolerance
(:func:`agent.inference.package.check_golden`; image packages:
``image_package.check_image_golden``), is warmed up (first-call allocations, kernel
compilation), and is timed on a batch of one window: the p50 over ``runs`` calls. The fastest
passing candidate is chosen; the other passing ones, fastest first, are the fallbacks of the
latency guard (:mod:`agent.inference.deadline`). A candidate that fails to load or fails the
golden check is never chosen. With a fixed ``backend`` only that runtime's artefacts are tried.

Recorded by :func:`record_selection`: ``edge_agent_backend_selected{stream,backend,precision}``
(1 for the choice, 0 for the others) and ``edge_agent_backend_benchmark_seconds`` (the p50s),
and one log line with the table. An image stream's backend is chosen the same way
(:func:`agent.inference.image_select.open_image_backend`).

Layers: :mod:`agent.inference.registry` (runtimes, which artefacts each runs) is below the
package loaders (:mod:`~agent.inference.package`, :mod:`~agent.inference.image_package`), which
are below this module; none of them imports this one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agent.errors import BackendUnavailable, ModelError
from agent.inference.base import Backend, install_hint
from agent.inference.choice_memory import ChoiceMemory, Ranked
from agent.inference.image_package import ImagePackage, check_image_golden
from agent.inference.package import ModelPackage, check_golden
from agent.inference.registry import artefacts_for, backend_kinds, build_backend, installed
from cloud_sync.manifest import Artefact

log = logging.getLogger("agent.inference")

#: A sensor package (golden windows in the manifest) or an image package (golden images in a
#: ``.npy`` file of the package).
AnyPackage = ModelPackage | ImagePackage

@dataclass(frozen=True, slots=True)
class Candidate:
    """One runtime on one artefact.

    Attributes:
        kind: The runtime (``onnxruntime``, ``openvino``, ``litert``).
        artefact: The manifest entry it runs.
    """

    kind: str
    artefact: Artefact

    @property
    def label(self) -> str:
        """Metric label: the runtime, ``-onnx`` when OpenVINO runs the ONNX artefact.

        The label tells apart two candidates of one runtime (OpenVINO on its IR and on ONNX).
        """
        if self.artefact.runtime == self.kind:
            return self.kind
        return f"{self.kind}-onnx" if self.artefact.runtime == "onnxruntime" else (
            f"{self.kind}-{self.artefact.runtime}")

    @property
    def precision(self) -> str:
        """``int8`` or ``fp32``."""
        return self.artefact.precision


@dataclass(frozen=True, slots=True)
class Trial:
    """The outcome of one candidate.

    Attributes:
        candidate: What was tried.
        backend: The loaded backend (None when it failed, or when a remembered ranking did
            not open it: :class:`Remembering`).
        p50_s: Median seconds of one single-window call (None when it failed).
        error: Why it cannot be used (None when it passed).
    """

    candidate: Candidate
    backend: Backend | None
    p50_s: float | None
    error: str | None


@dataclass(frozen=True, slots=True)
class Selection:
    """Every trial: passing ones fastest first, then the failed ones in candidate order.

    ``remembered``: the ranking came from :mod:`agent.inference.choice_memory` (p50s as timed
    when it was made; only the first ones opened), not from timing every candidate now.
    ``apart``: the candidates were timed now, in a child process (a :class:`Ranker`); only the
    first ones were opened here.
    """

    trials: tuple[Trial, ...]
    remembered: bool = False
    apart: bool = False

    @property
    def passing(self) -> list[Trial]:
        """Trials that passed, fastest first."""
        return [t for t in self.trials if t.error is None]

    @property
    def chosen(self) -> Trial:
        """The fastest passing trial.

        Raises:
            ModelError: none passed (the message lists every reason).
        """
        ok = self.passing
        if not ok:
            reasons = "; ".join(f"{t.candidate.label}/{t.candidate.precision}: {t.error}"
                                for t in self.trials) or "no artefact for any installed runtime"
            raise ModelError(f"no backend passed: {reasons}")
        return ok[0]

    @property
    def backends(self) -> list[Backend]:
        """Loaded backends of the passing trials, fastest first (the chosen one first)."""
        return [t.backend for t in self.passing if t.backend is not None]

    def table(self) -> str:
        """One line: ``label/precision p50 µs`` per trial, the chosen one marked ``*``.

        >>> from cloud_sync.manifest import Artefact
        >>> a = Artefact(runtime="onnxruntime", precision="int8", path="m.onnx",
        ...              sha256="0" * 64, size_bytes=1)
        >>> Selection((Trial(Candidate("onnxruntime", a), None, 4e-5, None),
        ...            Trial(Candidate("openvino", a), None, None, "golden"))).table()
        '*onnxruntime/int8 40.0 µs | openvino-onnx/int8 failed: golden'
        """
        cells = []
        for i, t in enumerate(self.trials):
            name = f"{t.candidate.label}/{t.candidate.precision}"
            mark = "*" if i == 0 and t.error is None else ""
            if t.error is None and t.p50_s is not None:
                cells.append(f"{mark}{name} {t.p50_s * 1e6:.1f} µs")
            else:
                cells.append(f"{name} failed: {t.error}")
        return " | ".join(cells)


def candidates(
    package: AnyPackage,
    backend: str = "auto",
    precision: str = "int8",
    is_installed: Callable[[str], bool] = installed,
) -> list[Candidate]:
    """Runtime × artefact pairs to try.

    Args:
        package: A verified package.
        backend: ``auto`` (every installed runtime) or one runtime name.
        precision: ``int8`` or ``fp32``.
        is_installed: Whether a runtime is installed.

    Raises:
        BackendUnavailable: a fixed ``backend`` is not installed (names the extra).
        ModelError: a fixed ``backend`` has no artefact of ``precision`` in the package.
    """
    if backend != "auto":
        if not is_installed(backend):
            raise BackendUnavailable(
                f"backend {backend} is not installed: {install_hint(backend)}",
                model=package.label,
            )
        arts = artefacts_for(package, backend, precision)
        if not arts:
            have = [f"{a.runtime}/{a.precision}" for a in package.manifest.artefacts]
            raise ModelError(f"no {precision} artefact that {backend} can run (package has "
                             f"{have})", model=package.label)
        return [Candidate(backend, a) for a in arts]
    return [Candidate(kind, a) for kind in backend_kinds() if is_installed(kind)
            for a in artefacts_for(package, kind, precision)]


@dataclass(frozen=True, slots=True)
class Remembering:
    """Where :func:`select_backend` remembers its ranking, and how much of it a later start
    opens (:mod:`agent.inference.choice_memory`).

    Attributes:
        memory: The agent's remembered selections.
        key: :func:`agent.inference.choice_memory.selection_key` of this selection.
        keep: Candidates a remembered ranking opens, fastest first (the others are listed
            with their remembered p50 but not loaded).
    """

    memory: ChoiceMemory
    key: str
    keep: int


#: One candidate timed by a :class:`Ranker`: runtime, artefact path, p50 seconds (None when it
#: failed), why it failed (None when it passed).
RankedTrial = tuple[str, str, float | None, str | None]


class Ranker(Protocol):
    """Times the candidates elsewhere (:func:`agent.inference.rank_child.child_ranker`): the
    trials of ``select_backend(package, backend, precision, runs=runs, warmup=warmup)`` as
    :data:`RankedTrial` rows, passing ones fastest first, or None when it could not."""

    def __call__(self, package: AnyPackage, backend: str, precision: str, runs: int,
                 warmup: int) -> list[RankedTrial] | None: ...


class Opener(Protocol):
    """Loads a candidate's backend (tests pass fakes)."""

    def __call__(self, package: AnyPackage, candidate: Candidate) -> Backend: ...


def registry_opener(threads: int = 1, cache_dir: Path | None = None,
                    streams: int = 1) -> Opener:
    """An :class:`Opener` building backends through the registry with these settings
    (``streams``: OpenVINO's inference streams, for handles sharing one compiled model)."""

    def open_(package: AnyPackage, candidate: Candidate) -> Backend:
        return build_backend(candidate.kind, package.path / candidate.artefact.path,
                             candidate.precision, threads=threads, cache_dir=cache_dir,
                             streams=streams)

    return open_


def benchmark(
    backend: Backend, window: Any, runs: int, warmup: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """p50 seconds of ``backend.run(window)`` over ``runs`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        backend.run(window)
    times = np.empty(runs)
    for i in range(runs):
        t0 = clock()
        backend.run(window)
        times[i] = clock() - t0
    return float(np.median(times))


def golden_window(package: AnyPackage) -> np.ndarray:
    """The first golden input as a batch of one (the timing input)."""
    if isinstance(package, ImagePackage):
        g = package.manifest.golden
        x = np.load(package.path / g.inputs_file, allow_pickle=False)[:1]
        return np.ascontiguousarray(x, dtype=np.float32)
    return np.asarray(package.manifest.golden.inputs[:1], dtype=np.float32)


def select_backend(
    package: AnyPackage,
    backend: str = "auto",
    precision: str = "int8",
    *,
    opener: Opener | None = None,
    is_installed: Callable[[str], bool] = installed,
    runs: int = 50,
    warmup: int = 5,
    clock: Callable[[], float] = time.perf_counter,
    remembering: Remembering | None = None,
    ranker: Ranker | None = None,
) -> Selection:
    """Try every candidate (load, golden check, warm-up, timing) and rank them.

    With ``remembering``, a ranking remembered under its key is used instead: only its first
    ``keep`` candidates are opened and golden-checked, so the other runtimes are not imported;
    when one of them is no longer a candidate or fails, the ranking is forgotten and every
    candidate is tried. A new ranking is remembered. With ``remembering`` and ``ranker``,
    every candidate is tried by the ranker (a child process) instead of here, and its ranking
    is remembered and opened like a remembered one; when the ranker fails, or its first
    candidates do not open here, the candidates are tried here.

    Args:
        package: A verified package.
        backend: ``auto`` or one runtime name.
        precision: ``int8`` or ``fp32``.
        opener: Loads a candidate (default: :func:`registry_opener`).
        is_installed: Whether a runtime is installed.
        runs: Timed single-window calls per candidate (after ``warmup`` calls).
        warmup: Untimed calls first.
        clock: Seconds, for the timing.
        remembering: Remember the ranking, and use a remembered one.
        ranker: Times the candidates elsewhere when nothing is remembered (needs
            ``remembering``; ``opener`` must open them with the ranker's settings).

    Returns:
        The ranked trials; ``chosen`` raises when none passed.

    Raises:
        BackendUnavailable: a fixed ``backend`` is not installed.
        ModelError: a fixed ``backend`` has no artefact of ``precision``.
    """
    open_ = opener or registry_opener()
    cands = candidates(package, backend, precision, is_installed)
    if remembering is not None:
        known = _open_remembered(package, cands, remembering, open_)
        if known is not None:
            return known
        if ranker is not None:
            apart = _rank_apart(package, cands, remembering, open_, ranker, (backend, precision,
                                                                            runs, warmup))
            if apart is not None:
                return apart
    window = golden_window(package)
    passed: list[Trial] = []
    failed: list[Trial] = []
    for cand in cands:
        try:
            b = open_(package, cand)
            _check(package, b)
            p50 = benchmark(b, window, runs, warmup, clock)
        except ModelError as exc:  # BackendUnavailable included
            failed.append(Trial(cand, None, None, str(exc)))
            continue
        passed.append(Trial(cand, b, p50, None))
    passed.sort(key=lambda t: t.p50_s if t.p50_s is not None else float("inf"))
    if remembering is not None and passed:
        remembering.memory.put(remembering.key, [
            (t.candidate.kind, t.candidate.artefact.path, float(t.p50_s or 0.0)) for t in passed])
    return Selection((*passed, *failed))


def deferred_open(package: AnyPackage, candidate: Candidate,
                  opener: Opener) -> Callable[[], Backend]:
    """A callable that opens ``candidate`` and checks it against the package's golden vectors
    when called (not before): the latency guard's fallback, loaded only when first needed
    (:class:`agent.inference.deadline.DeadlineGuard`).

    The callable raises :class:`~agent.errors.ModelError` when the candidate does not load or
    fails the check (the backend is then closed; also when the check ends in another error).
    """

    def open_now() -> Backend:
        backend = opener(package, candidate)
        try:
            _check(package, backend)
        except BaseException:  # ModelError, or a runtime's own error from its first run
            backend.close()
            raise
        return backend

    return open_now


def _check(package: AnyPackage, backend: Backend) -> None:
    if isinstance(package, ImagePackage):
        check_image_golden(package, backend)
    else:
        check_golden(package, backend)


def _open_remembered(package: AnyPackage, cands: list[Candidate], remembering: Remembering,
                     open_: Opener) -> Selection | None:
    """The remembered ranking with its first ``keep`` candidates opened and checked; None
    (ranking forgotten) when there is none or it no longer fits."""
    ranking = remembering.memory.get(remembering.key)
    if ranking is None:
        return None
    trials = _open_ranking(package, cands, ranking, remembering.keep, open_)
    if trials is None:
        remembering.memory.forget(remembering.key)
        return None
    return Selection(trials, remembered=True)


def _open_ranking(package: AnyPackage, cands: list[Candidate], ranking: list[Ranked],
                  keep: int, open_: Opener) -> tuple[Trial, ...] | None:
    """``ranking``'s trials, its first ``keep`` candidates opened and checked; None when a
    candidate is no longer one or a kept one fails (the ones opened are closed)."""
    by_id = {(c.kind, c.artefact.path): c for c in cands}
    if any((kind, path) not in by_id for kind, path, _ in ranking):
        return None
    trials: list[Trial] = []
    for i, (kind, path, p50) in enumerate(ranking):
        cand = by_id[(kind, path)]
        if i >= keep:
            trials.append(Trial(cand, None, p50, None))
            continue
        try:
            b = open_(package, cand)
            _check(package, b)
        except ModelError as exc:
            log.info("remembered backend %s/%s no longer usable (%s); selecting again",
                     cand.label, cand.precision, exc)
            for t in trials:
                if t.backend is not None:
                    t.backend.close()
            return None
        trials.append(Trial(cand, b, p50, None))
    return tuple(trials)


def _rank_apart(package: AnyPackage, cands: list[Candidate], remembering: Remembering,
                open_: Opener, ranker: Ranker,
                how: tuple[str, str, int, int]) -> Selection | None:
    """The ranker's ranking, remembered, with its first ``keep`` candidates opened here and its
    failures listed after them; None when the ranker failed or the opening did. The ranking is
    opened as the ranker gave it, not read back from the memory: a state directory that
    cannot be written (full disk) loses the memory, not the ranker's work."""
    rows = ranker(package, *how)
    if rows is None:
        return None
    by_id = {(c.kind, c.artefact.path): c for c in cands}
    known = [(by_id[(kind, path)], p50, error) for kind, path, p50, error in rows
             if (kind, path) in by_id]
    failed = tuple(Trial(c, None, None, error) for c, _, error in known if error is not None)
    ranking: list[Ranked] = sorted(
        [(c.kind, c.artefact.path, p50) for c, p50, error in known
         if error is None and p50 is not None], key=lambda r: r[2])
    if not ranking:
        return Selection(failed, apart=True)  # nothing passed: chosen raises with the reasons
    remembering.memory.put(remembering.key, ranking)
    opened = _open_ranking(package, cands, ranking, remembering.keep, open_)
    if opened is None:
        remembering.memory.forget(remembering.key)
        return None
    return Selection((*opened, *failed), apart=True)


def when(selection: Selection) -> str:
    """How old the p50s of a selection's log line are, and where they were timed."""
    if selection.remembered:
        return ", remembered from the start that timed every runtime"
    return ", timed in a child process" if selection.apart else ""


def record_selection(metrics: Any, stream: str, selection: Selection) -> None:
    """Set the selection gauges and log the table (one INFO line).

    Args:
        metrics: :class:`agent.metrics.Metrics` (``backend_selected``,
            ``backend_benchmark_seconds``).
        stream: Stream name.
        selection: From :func:`select_backend`; must have a chosen trial.
    """
    chosen = selection.chosen
    for t in selection.trials:
        labels = {"stream": stream, "backend": t.candidate.label,
                  "precision": t.candidate.precision}
        metrics.backend_selected.labels(**labels).set(1 if t is chosen else 0)
        if t.p50_s is not None:
            metrics.backend_benchmark_seconds.labels(**labels).set(t.p50_s)
    log.info("stream %s: backend %s/%s selected (p50 of one window%s): %s", stream,
             chosen.candidate.label, chosen.candidate.precision, when(selection),
             selection.table(),
             extra={"stream": stream, "backend": chosen.candidate.label})
