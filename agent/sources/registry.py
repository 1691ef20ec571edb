"""The source registry: every source kind is a plugin found through an entry-point group.

A package adds a source kind by naming a :class:`agent.sources.base.SourcePlugin` in the entry
point group :data:`GROUP` (``edge_agent.sources``) of its metadata; the built-in kinds are
declared the same way in this project's setup.cfg. :data:`BUILTIN` repeats those declarations so
that an installation whose metadata predates a built-in kind (an editable install made before
the kind was added) still has it; a test keeps the two lists equal.

The config classes are imported when this module is imported (the config schema is a
discriminated union over them); the implementation is named ``"module:Class"`` and imported by
:func:`build_source`, so a plugin's heavy dependencies (pyserial, OpenCV, pymodbus ...) load only
when a stream uses it.

A plugin that fails to load (its module does not import, its object is no ``SourcePlugin``,
its config has no ``kind`` literal equal to the entry point's name) is skipped with one warning
and named in the "unknown source kind" error; a plugin that reuses a built-in kind's name with
another target is ignored with a warning: the built-in kind stays.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import typing
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from agent.config.base import StrictModel
from agent.errors import ConfigError
from agent.sources.base import Source, SourcePlugin

log = logging.getLogger("agent.sources")

#: The entry-point group through which a package adds a source kind.
GROUP = "edge_agent.sources"

#: The built-in kinds, exactly as setup.cfg declares them in :data:`GROUP`.
BUILTIN: tuple[str, ...] = (
    "camera = agent.sources.camera:PLUGIN",
    "modbus = agent.sources.modbus_config:PLUGIN",
    "mqtt = agent.sources.mqtt_in_config:PLUGIN",
    "opcua = agent.sources.opcua_config:PLUGIN",
    "replay = agent.sources.replay:PLUGIN",
    "serial = agent.sources.serial:PLUGIN",
    "simulator = agent.sources.simulator:PLUGIN",
)


if TYPE_CHECKING:

    class PluginSourceConfig(StrictModel):
        """How the agent core types the config of a kind it does not special-case: a strict
        model with a ``kind`` (only for the type checker: no config is an instance of it)."""

        kind: str


def _builtin_entry_points() -> list[importlib.metadata.EntryPoint]:
    out = []
    for line in BUILTIN:
        name, _, value = (part.strip() for part in line.partition("="))
        out.append(importlib.metadata.EntryPoint(name=name, value=value, group=GROUP))
    return out


def _check(plugin: object, name: str) -> SourcePlugin:
    """The loaded entry point as a SourcePlugin; ValueError names what is wrong."""
    if not isinstance(plugin, SourcePlugin):
        raise ValueError(f"names a {type(plugin).__name__}, not an agent.sources.base.SourcePlugin")
    if plugin.kind != name:
        raise ValueError(f"its plugin's kind is {plugin.kind!r}")
    if not (isinstance(plugin.config, type) and issubclass(plugin.config, StrictModel)):
        raise ValueError("its config is not a StrictModel subclass")
    field = plugin.config.model_fields.get("kind")
    if field is None or typing.get_args(field.annotation) != (name,) or field.default != name:
        raise ValueError(f"its config {plugin.config.__name__} has no field "
                         f"kind: Literal[{name!r}] = {name!r}")
    missing = [f for f in plugin.path_fields if f not in plugin.config.model_fields]
    if missing:
        raise ValueError(f"path_fields {missing} are not fields of {plugin.config.__name__}")
    return plugin


def discover(
    entry_points: list[importlib.metadata.EntryPoint] | None = None,
) -> tuple[dict[str, SourcePlugin], dict[str, str]]:
    """Load every source plugin: the built-ins, then the installed entry points of :data:`GROUP`.

    Args:
        entry_points: The installed entry points to consider; None = the group's entry points of
            every installed distribution.

    Returns:
        ``(plugins by kind, reason by kind for plugins that failed to load)``.
    """
    if entry_points is None:
        entry_points = list(importlib.metadata.entry_points(group=GROUP))
    builtin = {ep.name: ep.value for ep in _builtin_entry_points()}
    plugins: dict[str, SourcePlugin] = {}
    broken: dict[str, str] = {}
    for ep in [*_builtin_entry_points(), *entry_points]:
        if ep.name in plugins or ep.name in broken:
            if builtin.get(ep.name, ep.value) != ep.value:
                log.warning("source plugin %s = %s ignored: %r is a built-in source kind",
                            ep.name, ep.value, ep.name)
            continue
        try:
            plugins[ep.name] = _check(ep.load(), ep.name)
        except Exception as exc:
            broken[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
            log.warning("source plugin %s = %s not loaded: %s", ep.name, ep.value, broken[ep.name])
    return dict(sorted(plugins.items())), broken


PLUGINS, BROKEN = discover()

#: kind -> (config class, "module:Class" of the implementation).
REGISTRY: dict[str, tuple[type[StrictModel], str]] = {
    kind: (plugin.config, plugin.implementation) for kind, plugin in PLUGINS.items()
}


def source_kinds() -> tuple[str, ...]:
    """Return the registered kinds, sorted.

    >>> source_kinds()
    ('camera', 'modbus', 'replay', 'serial', 'simulator')
    """
    return tuple(sorted(REGISTRY))


def source_config_union() -> Any:
    """The config schema's ``[streams.source]`` type: a union of every kind's config class,
    discriminated by ``kind``."""
    members = tuple(plugin.config for plugin in PLUGINS.values())
    return Annotated[typing.Union[members], Field(discriminator="kind")]  # noqa: UP007


def path_fields(kind: str) -> tuple[str, ...]:
    """The path fields of ``kind``'s config (empty for an unknown kind)."""
    plugin = PLUGINS.get(kind)
    return plugin.path_fields if plugin is not None else ()


def describe_kinds() -> list[str]:
    """One line per installed kind: ``kind: first line of its config's docstring``.

    A plugin config without a docstring is listed as ``kind: (no description)``.
    """
    lines = {kind: (plugin.config.__doc__ or "").strip().splitlines()
             for kind, plugin in PLUGINS.items()}
    return [f"{kind}: {doc[0] if doc else '(no description)'}" for kind, doc in lines.items()]


def load_class(kind: str) -> type[Any]:
    """Import and return the implementation class of ``kind``.

    Raises:
        ConfigError: When ``kind`` is not registered (the message names a plugin of that name
            that failed to load, and why).
    """
    try:
        _, target = REGISTRY[kind]
    except KeyError:
        why = f" (its plugin failed to load: {BROKEN[kind]})" if kind in BROKEN else ""
        raise ConfigError(
            f"unknown source kind {kind!r}{why}; known kinds: {', '.join(source_kinds())}"
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
