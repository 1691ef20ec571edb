"""What the agent does differently per kind of source: how a camera stream's stall is judged
(:func:`camera_policy`) and how an aggregate for an interval the store already holds is stored
(:func:`repeat_policy`).
"""

from __future__ import annotations

from agent.config.schema import AgentConfig
from agent.health import StallPolicy, camera_stall_policy
from agent.sources.camera import CameraConfig
from agent.sources.replay import ReplayConfig
from agent.sources.simulator import SimulatorConfig
from agent.store.parts import RepeatPolicy


def camera_policy(config: AgentConfig, name: str) -> StallPolicy:
    """The stall policy of camera stream ``name`` (its ``camera`` source config)."""
    sc = next(s for s in config.streams if s.name == name)
    assert isinstance(sc.source, CameraConfig)
    return camera_stall_policy(sc.source, sc.stall_after_s)


def repeat_policy(source: object) -> RepeatPolicy:
    """How a stream's aggregate for an interval the store already holds is stored
    (:data:`agent.store.parts.RepeatPolicy`): a recorded input (replay file, video file, image
    folder) is read again from its start after a restart, so an aggregate with the same
    readings is a copy; a simulator faster than real time rewrites its own timeline, so the
    repeat is a copy; a live source in real time (serial port, camera device or stream URL,
    simulator at ``speed = 1``) only ever sends new readings, so the repeat is the next part.
    """
    if isinstance(source, CameraConfig):  # a watched folder sends only new images
        recorded = source.path is not None or source.folder is not None
        return "same_readings" if recorded and not source.watch else "part"
    if isinstance(source, ReplayConfig):
        return "same_readings"
    if isinstance(source, SimulatorConfig):
        return "part" if source.speed == 1.0 else "ignore"
    return "part"
