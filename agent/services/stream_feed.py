"""The producer side of :class:`agent.publish.stream_state.StateBoard`, and the per-stream gauges.

The composition root calls :meth:`StateFeed.scored` after each block or frame a stream scored,
:meth:`StateFeed.episode` when an episode opens or closes, and :meth:`StateFeed.health` at each
heartbeat with the sources' health (``/healthz`` components ``source:<stream>``). The feed turns
that into one :class:`~agent.publish.stream_state.StreamState` per stream:

* ``down``: the source's health is red (not delivering: failed, stalled, outage);
* ``finished``: the source reached the end of a finite input normally (a replay without
  ``loop``, a simulator's ``duration_s``); it stays so until the stream starts again;
* ``calibrating``: no threshold yet;
* ``anomalous``: an episode is open (raised, not cleared);
* ``degraded``: the source's health is yellow, or the latency budget skips windows;
* ``normal``: otherwise.

and sets ``edge_agent_stream_score``, ``edge_agent_stream_threshold`` and
``edge_agent_stream_anomaly_active`` (label ``stream``), so Grafana can plot score against
threshold.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from agent.metrics import Metrics
from agent.publish.stream_state import StateBoard, StreamState, StreamStatus


@dataclass(slots=True)
class _Known:
    kind: Literal["sensor", "camera"]
    model_name: str = ""
    model_version: int = 0
    score: float | None = None
    threshold: float | None = None
    episode_id: str | None = None
    health: str = "green"
    skipping: bool = False
    finished: bool = False


class StateFeed:
    """Builds each stream's present state (see the module docstring).

    Args:
        board: Where the states go.
        metrics: Receives the per-stream gauges.
        clock: Wall clock, epoch seconds UTC (``updated_at``).
    """

    def __init__(self, board: StateBoard, metrics: Metrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.board = board
        self._metrics = metrics
        self._clock = clock
        self._known: dict[str, _Known] = {}

    def add(self, stream: str, kind: Literal["sensor", "camera"], model_name: str,
            model_version: int, threshold: float | None, episode_id: str | None = None) -> None:
        """Announce a configured stream (at start, before its first score)."""
        self._known[stream] = _Known(kind, model_name, model_version, None,
                                     _finite(threshold), episode_id)
        self._metrics.stream_anomaly_active.labels(stream=stream).set(episode_id is not None)
        self._publish(stream)

    def scored(self, stream: str, score: float | None, threshold: float | None, *,
               model_name: str | None = None, model_version: int | None = None,
               skipping: bool = False) -> None:
        """The stream's last scored window (``score`` None: nothing scored in this block)."""
        k = self._known.get(stream)
        if k is None:
            return
        if score is not None and math.isfinite(score):
            k.score = score
            self._metrics.stream_score.labels(stream=stream).set(score)
        k.threshold = _finite(threshold)
        if k.threshold is not None:
            self._metrics.stream_threshold.labels(stream=stream).set(k.threshold)
        if model_name is not None:
            k.model_name = model_name
        if model_version is not None:
            k.model_version = model_version
        k.skipping = skipping
        self._publish(stream)

    def episode(self, stream: str, episode_id: str | None) -> None:
        """An episode opened (its id) or closed (None)."""
        k = self._known.get(stream)
        if k is None:
            return
        k.episode_id = episode_id
        self._metrics.stream_anomaly_active.labels(stream=stream).set(episode_id is not None)
        self._publish(stream)

    def health(self, states: dict[str, str], finished: frozenset[str] = frozenset()) -> None:
        """The sources' health by stream: ``green``, ``yellow`` or ``red``; ``finished``: the
        streams whose finite input ended normally (their health is yellow, ``exhausted``)."""
        for stream, state in states.items():
            k = self._known.get(stream)
            if k is None:
                continue
            done = stream in finished
            if k.health != state or k.finished != done:
                k.health, k.finished = state, done
                self._publish(stream)

    def _publish(self, stream: str) -> None:
        k = self._known[stream]
        self.board.update(StreamState(
            stream=stream, kind=k.kind, status=_status(k), score=k.score,
            threshold=k.threshold, model_name=k.model_name, model_version=k.model_version,
            episode_id=k.episode_id, updated_at=self._clock()))


def _status(k: _Known) -> StreamStatus:
    if k.health == "red":
        return "down"
    if k.finished:
        return "finished"
    if k.threshold is None:
        return "calibrating"
    if k.episode_id is not None:
        return "anomalous"
    if k.health == "yellow" or k.skipping:
        return "degraded"
    return "normal"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
