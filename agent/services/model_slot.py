"""The handoff between the model updater's thread and a stream's pipeline thread.

The updater never touches a :class:`~agent.pipeline.stream.StreamPipeline`: it posts a command
(:class:`Observe`, :class:`Swap`, :class:`Rollback`) to the stream's :class:`ModelSlot` and waits
for ``applied``. The pipeline thread calls :meth:`ModelSlot.sync` before and after every block;
``sync`` takes the pending command under the lock and applies it to the pipeline, between two
blocks, so no reading is dropped or scored twice and alerts keep their ids. After the block,
``sync`` also notices when the swapped-in detector failed at run time and the pipeline fell back
to the previous one (:attr:`~agent.pipeline.stream.StreamPipeline.fallback_error`): the slot's
package goes back to the previous one and :attr:`ModelSlot.failure` is set for the updater.

The slot's :attr:`~ModelSlot.package` is the package in force: alerts are stamped with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.errors import ModelError
from agent.inference.package import ModelPackage
from agent.pipeline.detector import Calibration, FeatureDeviationDetector
from agent.pipeline.stream import BatchObserver, StreamPipeline
from agent.services.model_checks import ShadowRun


@dataclass
class Observe:
    """Attach ``observer`` (None detaches)."""

    observer: BatchObserver | None
    applied: threading.Event = field(default_factory=threading.Event)


@dataclass
class Swap:
    """Score with ``detector``/``calibration`` of ``package``; keep the current as fallback.

    With ``watch_windows``, the slot attaches ``watch``: a :class:`ShadowRun` in which the
    previous model scores the next windows beside the new one (the post-swap watch).
    """

    package: ModelPackage
    detector: FeatureDeviationDetector
    calibration: Calibration
    watch_windows: int = 0
    watch: ShadowRun | None = None
    applied: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


@dataclass
class Rollback:
    """Go back to the fallback (the previous detector) now."""

    applied: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


Command = Observe | Swap | Rollback


class ModelSlot:
    """One stream's model handoff (see the module docstring).

    Args:
        stream: Stream name.
        package: The package the pipeline starts with.
        on_change: Called in the pipeline thread with the package in force after a swap, a
            rollback or a run-time fallback (metrics).
    """

    def __init__(
        self,
        stream: str,
        package: ModelPackage,
        on_change: Callable[[ModelPackage], None] | None = None,
    ) -> None:
        self.stream = stream
        self.package = package
        self.previous: ModelPackage | None = None
        self._on_change = on_change
        self._lock = threading.Lock()
        self._pending: Command | None = None
        #: The run-time error that made the pipeline fall back (set by the pipeline thread).
        self.failure: ModelError | None = None
        self.failed = threading.Event()

    def post(self, command: Command) -> None:
        """Queue ``command`` for the pipeline thread (replaces one not yet applied)."""
        with self._lock:
            self._pending = command

    def withdraw(self, command: Command) -> bool:
        """Take ``command`` back if it was not applied yet; True when withdrawn."""
        with self._lock:
            if self._pending is command:
                self._pending = None
                return True
            return False

    def sync(self, pipeline: StreamPipeline) -> ModelPackage:
        """Apply a pending command and notice a run-time fallback (pipeline thread only).

        Returns:
            The package in force.
        """
        if pipeline.fallback_error is not None:
            self.failure, pipeline.fallback_error = pipeline.fallback_error, None
            if self.previous is not None:
                self.package, self.previous = self.previous, None
            pipeline.observer = None
            self.failed.set()
            self._changed()
        if self._pending is None:  # unlocked peek: a command posted now is taken next block
            return self.package
        with self._lock:
            cmd, self._pending = self._pending, None
        if isinstance(cmd, Observe):
            pipeline.observer = cmd.observer
        elif isinstance(cmd, Swap):
            try:
                pipeline.swap(cmd.detector, cmd.calibration)
            except ValueError as exc:
                cmd.error = str(exc)
            else:
                self.previous, self.package = self.package, cmd.package
                self.failure = None
                self.failed.clear()
                if cmd.watch_windows:
                    cmd.watch = ShadowRun(cmd.watch_windows, pipeline.fallback)
                pipeline.observer = cmd.watch
                self._changed()
        elif pipeline.fallback is None:
            cmd.error = "no previous model to roll back to"
        else:
            detector, calibration = pipeline.fallback
            pipeline.swap(detector, calibration, keep_fallback=False)
            pipeline.observer = None
            if self.previous is not None:
                self.package, self.previous = self.previous, None
            self._changed()
        cmd.applied.set()
        return self.package

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.package)
