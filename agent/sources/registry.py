"""The source registry: one line per kind, implementations imported only when built.

Adding a source kind is one line in :data:`REGISTRY` (plus its module, laid out as kind constant,
config class, implementation). The config classes are imported eagerly (the config schema needs
them); the implementation is named ``"module:Class"`` and imported by :func:`build_source`, so a
plugin's heavy dependencies (pyserial, OpenCV ...) load only when a stream uses it.
"""

from __future__ import annotations

import importlib
from typing import Any

from agent.config.base import StrictModel
from agent.errors import ConfigError
from agent.sources import camera, replay, serial, simulator
from agent.sources.base import Source

#: kind -> (config class, "module:Class" of the implementation).
REGISTRY: dict[str, tuple[type[StrictModel], str]] = {
    camera.KIND: (camera.CameraConfig, "agent.sources.camera:CameraSource"),
    replay.KIND: (replay.ReplayConfig, "agent.sources.replay:ReplaySource"),
    serial.KIND: (serial.SerialConfig, "agent.sources.serial:SerialSource"),
    simulator.KIND: (simulator.SimulatorConfig, "agent.sources.simulator:SimulatorSource"),
}


def source_kinds() -> tuple[str, ...]:
    """Return the registered kinds, sorted.

    >>> source_kinds()
    ('camera', 'replay', 'serial', 'simulator')
    """
    return tuple(sorted(REGISTRY))


def load_class(kind: str) -> type[Any]:
    """Import and return the implementation class of ``kind``.

    Raises:
        ConfigError: When ``kind`` is not registered.
    """
    try:
        _, target = REGISTRY[kind]
    except KeyError:
        raise ConfigError(
            f"unknown source kind {kind!r}; known kinds: {', '.join(source_kinds())}"
        ) from None
    module_name, _, class_name = target.partition(":")
    cls: type[Any] = getattr(importlib.import_module(module_name), class_name)
    return cls


def build_source(config: StrictModel, stream: str, **dependencies: Any) -> Source:
    """Construct the source a config describes.

    Args:
        config: A registered source config (its ``kind`` field picks the implementation).
        stream: The stream name the source stamps on its readings.
        **dependencies: Passed to the constructor (``clock``, ``sleep``, ``serial_factory`` ...).

    Returns:
        The source, with ``channels`` known.

    Raises:
        ConfigError: When the kind is unknown or the config is not that kind's config class.
        SourceError: When the source cannot start (e.g. the replay file is missing).
    """
    kind = getattr(config, "kind", None)
    if not isinstance(kind, str):
        raise ConfigError(f"source config {type(config).__name__} has no 'kind'", stream=stream)
    cls = load_class(kind)
    config_class, _ = REGISTRY[kind]
    if not isinstance(config, config_class):
        raise ConfigError(
            f"source kind {kind!r} needs a {config_class.__name__}, got {type(config).__name__}",
            stream=stream,
        )
    source: Source = cls(config, stream, **dependencies)
    return source
