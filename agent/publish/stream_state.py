"""The present state of every stream, for consumers that want "now" rather than events.

One :class:`StateBoard` per agent. The pipeline (the producer) calls :meth:`StateBoard.update`
with a :class:`StreamState` after each scored window or status change; the consumers (the
retained-state publisher, Home Assistant discovery, Sparkplug B) register a listener with
:meth:`StateBoard.subscribe` and are called with each state that changed, and with
``None``-status removals when a stream leaves the config (:meth:`StateBoard.remove`).

Listeners run on the producer's thread and must not block: they hand the state to their own
queue or outbox. A listener that raises is logged once per stream and kept.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

StreamStatus = Literal["normal", "anomalous", "calibrating", "degraded", "down", "finished"]
STATUSES: tuple[StreamStatus, ...] = (
    "normal", "anomalous", "calibrating", "degraded", "down", "finished")


@dataclass(frozen=True, slots=True)
class StreamState:
    """One stream's present state.

    Attributes:
        stream: Stream name (the config's ``[[streams]] name``).
        kind: ``"sensor"`` or ``"camera"``.
        status: ``normal`` (scored, no episode), ``anomalous`` (an episode is open),
            ``calibrating`` (collecting the calibration windows), ``degraded`` (scoring, but
            the source reports errors or the latency budget skips windows), ``down`` (the
            source is not delivering), ``finished`` (a finite source, a recorded file or a
            simulator with a duration, reached its end normally: nothing more will be scored).
        score: The last window's score (the model's units: reconstruction error or its
            robust z-score), or None before the first scored window.
        threshold: The threshold in force, or None before calibration ends.
        model_name: Name of the model package scoring the stream ("" before one is loaded).
        model_version: Its integer version (0 before one is loaded).
        episode_id: The open episode's alert id while ``status == "anomalous"``, else None.
        updated_at: When this state was produced, epoch seconds UTC.
    """

    stream: str
    kind: Literal["sensor", "camera"]
    status: StreamStatus
    score: float | None
    threshold: float | None
    model_name: str
    model_version: int
    episode_id: str | None
    updated_at: float

    def same_as(self, other: StreamState | None) -> bool:
        """True when ``other`` differs at most in ``score`` and ``updated_at``."""
        if other is None:
            return False
        # field by field (no copies: the pipeline thread asks once per scored window)
        return (self.stream == other.stream and self.kind == other.kind
                and self.status == other.status and self.threshold == other.threshold
                and self.model_name == other.model_name
                and self.model_version == other.model_version
                and self.episode_id == other.episode_id)

    def to_payload(self) -> dict[str, object]:
        """The JSON object of the retained state topic (keys as the attribute names)."""
        return {
            "stream": self.stream,
            "kind": self.kind,
            "status": self.status,
            "score": self.score,
            "threshold": self.threshold,
            "model_name": self.model_name,
            "model_version": self.model_version,
            "episode_id": self.episode_id,
            "updated_at": self.updated_at,
        }


Listener = Callable[[str, "StreamState | None"], None]
"""Called with ``(stream, state)``; ``state`` is None when the stream was removed."""


class StateBoard:
    """Thread-safe latest :class:`StreamState` per stream, with change listeners."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, StreamState] = {}
        self._listeners: list[Listener] = []
        self._failed: set[tuple[int, str]] = set()
        self._log = logger or logging.getLogger(__name__)

    def subscribe(self, listener: Listener) -> None:
        """Add ``listener``; it is called at once with every state already on the board."""
        with self._lock:
            self._listeners.append(listener)
            present = list(self._states.values())
        for state in present:
            self._call(listener, state.stream, state)

    def update(self, state: StreamState) -> bool:
        """Record ``state``; call the listeners and return True when it is not
        :meth:`StreamState.same_as` the previous one, or the score changed."""
        with self._lock:
            old = self._states.get(state.stream)
            self._states[state.stream] = state
            listeners = list(self._listeners)
        changed = old is None or not state.same_as(old) or old.score != state.score
        if changed:
            for listener in listeners:
                self._call(listener, state.stream, state)
        return changed

    def remove(self, stream: str) -> None:
        """Forget ``stream`` (it left the config) and tell the listeners with ``None``."""
        with self._lock:
            had = self._states.pop(stream, None) is not None
            listeners = list(self._listeners)
        if had:
            for listener in listeners:
                self._call(listener, stream, None)

    def get(self, stream: str) -> StreamState | None:
        """The latest state of ``stream``, or None."""
        with self._lock:
            return self._states.get(stream)

    def all(self) -> list[StreamState]:
        """Every stream's latest state, by stream name."""
        with self._lock:
            return [self._states[k] for k in sorted(self._states)]

    def _call(self, listener: Listener, stream: str, state: StreamState | None) -> None:
        try:
            listener(stream, state)
        except Exception:
            key = (id(listener), stream)
            if key not in self._failed:
                self._failed.add(key)
                self._log.exception("stream state listener failed for stream %s", stream)
