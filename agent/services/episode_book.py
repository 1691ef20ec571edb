"""Which episode an event belongs to, how it is stored, and what id a recorded input's event gets.

The pipelines decide the lifecycle events (:mod:`agent.pipeline.episodes`); the composition root
stores each through :class:`agent.publish.keeper.AlertKeeper`. :class:`EpisodeBook` is the part in
between: per stream it holds the open episode's id (the ``raised`` event's ``alert_id``), builds
the :class:`~agent.store.episodes.EpisodeMark` stored with each event (so a restart finds the open
episodes, :meth:`EpisodeBook.restore`), and gives the events of recorded inputs their derived
sequence numbers (:mod:`agent.pipeline.event_ids`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from agent.errors import StoreError
from agent.pipeline.episodes import Lifecycle
from agent.pipeline.event_ids import recorded_seq
from agent.pipeline.stream import AlertEvent
from agent.sources.camera import CameraConfig
from agent.sources.replay import ReplayConfig
from agent.store.episodes import EpisodeMark
from agent.store.sqlite import Store

log = logging.getLogger("agent")


@dataclass(frozen=True, slots=True)
class Plan:
    """How to store one event.

    Attributes:
        episode_id: The open episode's id (None for ``raised``: its own ``alert_id``).
        mark: What it does to the stream's open episode.
        seq: A derived sequence number (recorded inputs), or None for the stream's next one.
    """

    episode_id: str | None
    mark: EpisodeMark
    seq: int | None


def recorded_identity(source: object) -> str | None:
    """The identity of a recorded input read from its start, or None for a live source:
    ``"replay:<file name>"`` for a replay without ``restamp``/``loop``, ``"camera"`` for a
    video file or image folder that is neither watched nor looped (each frame's own file is
    the identity then)."""
    if isinstance(source, ReplayConfig):
        if source.restamp or source.loop:
            return None
        return "replay:" + Path(source.path).name
    if isinstance(source, CameraConfig):
        recorded = source.path is not None or source.folder is not None
        return "camera" if recorded and not source.watch and not source.loop else None
    return None


class EpisodeBook:
    """Open episode ids and the storage plan of each event (pipeline thread only).

    Args:
        recorded: Per stream, :func:`recorded_identity` of its source.
    """

    def __init__(self, recorded: dict[str, str | None]) -> None:
        self._recorded = recorded
        #: Per stream: the open episode's id.
        self.open: dict[str, str] = {}

    def plan(self, event: AlertEvent, episodic: bool) -> Plan | None:
        """The plan for ``event``; None for an ``updated``/``cleared`` event of no known
        episode (logged; cannot happen unless the store lost the episode's row).

        Args:
            event: The event.
            episodic: The stream's rules have episodes (``clear_windows > 0``).
        """
        seq = self._seq(event)
        if event.kind == "raised":
            return Plan(None, EpisodeMark(open=episodic, peak_score=event.score,
                                          reported_ts=event.window_end), seq)
        episode = self.open.get(event.stream)
        if episode is None:
            log.warning("stream %s: %s event of no open episode; not sent", event.stream,
                        event.kind)
            return None
        peak = event.peak_score if event.peak_score is not None else event.score
        return Plan(episode, EpisodeMark(close=event.kind == "cleared", peak_score=peak,
                                         reported_ts=event.window_end), seq)

    def stored(self, event: AlertEvent, alert_id: str, plan: Plan) -> None:
        """Record that ``event`` was stored (or handed to MQTT) as ``alert_id``."""
        if plan.mark.open:
            self.open[event.stream] = alert_id
        elif plan.mark.close:
            self.open.pop(event.stream, None)

    def restore(self, store: Store, lifecycles: dict[str, Lifecycle]) -> None:
        """Continue the episodes open in ``store`` (the streams in ``lifecycles``) and forget
        those of streams no longer configured (logged: no ``cleared`` follows for them)."""
        try:
            stored = store.open_episodes()
        except StoreError as exc:
            log.warning("open alert episodes unreadable (%s): none continued", exc)
            return
        for stream, ep in stored.items():
            life = lifecycles.get(stream)
            if life is None:
                log.warning("stream %s left the config with episode %s open: no 'cleared' "
                            "will follow", stream, ep.episode_id)
                try:
                    store.forget_episode(stream)
                except StoreError as exc:
                    log.warning("stream %s: open episode not forgotten: %s", stream, exc)
                continue
            life.resume(ep.peak_score, ep.reported_ts)
            if life.open:
                self.open[stream] = ep.episode_id
                log.info("stream %s: episode %s continues (peak %.3f)", stream, ep.episode_id,
                         ep.peak_score)

    def _seq(self, event: AlertEvent) -> int | None:
        identity = self._recorded.get(event.stream)
        if identity is None:
            return None
        if identity == "camera":
            if event.origin is None:
                return None
            return recorded_seq(event.origin.file, event.kind, event.origin.frame or 0)
        return recorded_seq(identity, event.kind, round(event.window_start * 1000))
