"""An image stream's backend: the auto-selection of :mod:`agent.inference.select` for an image
package, run once per model for the camera streams of one agent (:data:`ImageChoices`) and
remembered across restarts (:mod:`agent.inference.choice_memory`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import ModelError
from agent.inference.base import Backend
from agent.inference.choice_memory import ChoiceMemory, selection_key
from agent.inference.image_package import ImagePackage, check_image_golden
from agent.inference.rank_child import child_ranker
from agent.inference.select import Candidate, Remembering, registry_opener, select_backend, when

log = logging.getLogger("agent.inference")

#: Image backends chosen so far: (package folder, precision, ``backend`` setting) -> the
#: candidate and the first stream's backend (shared when its runtime allows: :func:`_another`).
ImageChoices = dict[tuple[str, str, str], tuple[Candidate, Backend]]


def _another(first: Backend) -> Backend | None:
    """A handle sharing ``first``'s loaded model, or None when its runtime has no such sharing,
    ``first`` is closed or has no room for another handle.

    ONNX Runtime: one session serves concurrent calls. OpenVINO: one compiled model with an
    inference stream per camera (``streams``), an infer request per handle; a compiled model
    with all its streams taken is not shared (one more handle would wait for another's
    inference). LiteRT is not shared: an interpreter serves one call at a time.
    """
    share: Any = getattr(first, "share", None)
    if share is None:
        return None
    try:
        other: Backend = share()
    except ModelError:
        return None
    return other


def open_image_backend(package: ImagePackage, precision: str = "int8", threads: int = 1,
                       backend: str = "auto", cache_dir: Path | None = None,
                       choices: ImageChoices | None = None,
                       memory: ChoiceMemory | None = None,
                       progress: Callable[[], None] | None = None, streams: int = 1) -> Backend:
    """Pick the image package's backend like a sensor stream's (:mod:`agent.inference.select`):
    every installed runtime on every artefact of ``precision`` it can run (OpenVINO on the IR
    and on the ONNX file, ONNX Runtime on the ONNX file), kept when it reproduces the golden
    scores within the tolerance, the fastest on one image chosen; ``backend`` pins a runtime.
    The candidates not chosen are closed at once.

    ``choices`` (shared by the camera streams of one agent) remembers each choice: a stream
    whose package, precision and ``backend`` setting were already chosen for opens that
    candidate only (golden check included, no timing), so N cameras on one model select once
    and load the other runtimes once, not N times; on ONNX Runtime they share the first
    stream's session (one copy of the weights and buffers), on OpenVINO its compiled model (one
    copy of the weights and kernels, an infer request each; ``streams``: how many camera streams
    use this model, the compiled model's inference streams), on LiteRT each opens its own
    interpreter. ``memory`` (the agent's,
    in its state directory) remembers the ranking across restarts: a later start opens the
    chosen candidate only and imports no other runtime (:mod:`agent.inference.choice_memory`);
    with ``memory``, a first selection times the runtimes in a child process
    (:mod:`agent.inference.rank_child`), so this process imports only the chosen one;
    ``progress`` is called every few seconds while that child runs.

    Raises:
        ModelError: no artefact of ``precision``, or none loads and passes the golden check.
        agent.errors.BackendUnavailable: a pinned ``backend`` is not installed.
    """
    opener = registry_opener(threads, cache_dir, streams)
    key = (str(package.path), precision, backend)
    known = None if choices is None else choices.get(key)
    if known is not None:
        cand, first = known
        shared = _another(first)
        b = shared if shared is not None else opener(package, cand)
        check_image_golden(package, b)
        log.info("image model %s: backend %s/%s (chosen for another stream of this model%s)",
                 package.label, cand.label, cand.precision,
                 ", its loaded model shared" if shared is not None else "")
        return b
    remembering = (None if memory is None else Remembering(
        memory, selection_key(package, backend, precision, threads), keep=1))
    selection = select_backend(package, backend, precision, opener=opener, runs=20, warmup=3,
                               remembering=remembering,
                               ranker=None if memory is None else child_ranker(
                                   threads, cache_dir, progress=progress))
    chosen = selection.chosen  # raises ModelError when none passed
    assert chosen.backend is not None
    for other in selection.backends[1:]:
        other.close()
    if choices is not None:
        choices[key] = (chosen.candidate, chosen.backend)
    log.info("image model %s: backend %s/%s selected (p50 of one image%s): %s", package.label,
             chosen.candidate.label, chosen.candidate.precision, when(selection),
             selection.table())
    return chosen.backend
