"""Pre-flight checks: what the schema cannot see (files that must exist, models that must load).

``edge-agent check-config`` runs them after the schema, and ``edge-agent run`` before it starts
anything, so a config that points at a missing model or data file fails as a configuration error
(exit 78, which systemd's ``RestartPreventExitStatus=78`` does not restart in a loop) instead of
as a run-time failure restarted forever.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from agent.config.builtin_models import not_found_problem
from agent.config.schema import AgentConfig, resolve_model_path
from agent.errors import ConfigError, ModelError, SourceError
from agent.extras import missing_module

if TYPE_CHECKING:
    from agent.sources.camera import CameraConfig
    from agent.sources.replay import ReplayConfig


def preflight(config: AgentConfig) -> list[str]:
    """Check files and model packages a resolved config refers to.

    Args:
        config: A config whose paths are absolute (``AgentConfig.resolved``).

    Returns:
        One ``key.path: message`` per problem; empty when everything is in place.
    """
    from agent.inference.image_package import load_image_package  # noqa: PLC0415
    from agent.inference.package import load_package  # noqa: PLC0415
    from agent.sources.camera import CameraConfig  # noqa: PLC0415
    from agent.sources.replay import ReplayConfig  # noqa: PLC0415

    problems: list[str] = []
    for i, stream in enumerate(config.streams):
        key = f"streams[{i}]"
        source = stream.source
        if isinstance(source, ReplayConfig) and not Path(source.path).is_file():
            problems.append(f"{key}.source.path: {_not_a_file(Path(source.path))}")
        if isinstance(source, CameraConfig):
            problems.extend(_camera_modules(key, source, config.snapshots.enabled))
            if source.path is not None and not Path(source.path).is_file():
                problems.append(f"{key}.source.path: no such video file {source.path!r}")
            # a watched folder may be a share mounted later: an outage at run time, not a
            # config problem (RestartPreventExitStatus=78 would keep every stream down)
            if (source.folder is not None and not source.watch
                    and not Path(source.folder).is_dir()):
                problems.append(f"{key}.source.folder: no such folder {source.folder!r}")
        try:
            path = resolve_model_path(stream.model, Path.cwd())
        except ValueError as exc:
            problems.append(f"{key}.model: {exc}")
            continue
        if missing := not_found_problem(path):
            problems.append(f"{key}.model: {missing}")
            continue
        try:
            if isinstance(source, CameraConfig):
                load_image_package(path)
                continue
            package = load_package(path)
        except ModelError as exc:
            problems.append(f"{key}.model: {exc}")
            continue
        if isinstance(source, ReplayConfig) and Path(source.path).is_file():
            problems.extend(_replay_columns(key, stream.name, source,
                                            tuple(package.manifest.input.channels)))
        names = getattr(source, "channel_names", None)  # a source whose map names them
        if callable(names):
            absent = [c for c in package.manifest.input.channels if c not in names()]
            if absent:
                problems.append(f"{key}.source.channels: the model's channel(s) {absent} are "
                                f"not in the source's map (it has {list(names())})")
    mqtt_keys = ("password_file", "ca_file", "cert_file", "key_file", "key_password_file")
    files = [(f"mqtt.{k}", getattr(config.mqtt, k) if _uses_broker(config) else None)
             for k in mqtt_keys]
    fleet = getattr(config, "fleet", None)
    if fleet is not None and fleet.enabled:
        files += [("fleet.token_file", fleet.token_file), ("fleet.ca_file", fleet.ca_file)]
    for name, value in files:
        if value is not None and not Path(value).is_file():
            problems.append(f"{name}: no such file {value!r}")
    problems.extend(_credentials(config))
    problems.extend(_mqtt_consumers(config))
    problems.extend(_state_dir(Path(config.agent.state_dir)))
    return problems


def _not_a_file(path: Path) -> str:
    """Why ``path`` (not a regular file) cannot be read as a recording."""
    if path.is_dir():
        return f"{str(path)!r} is a directory, not a file"
    if path.exists():
        return f"{str(path)!r} is not a regular file (a device or a pipe)"
    return f"no such file {str(path)!r}"


def _state_dir(state_dir: Path) -> list[str]:
    """``agent.state_dir`` can be created (or is a directory) and written to: its nearest
    existing ancestor is a directory this process may write to. ``run`` would otherwise fail at
    its lock file with exit 1, which systemd restarts in a loop."""
    existing = state_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f"agent.state_dir: {str(existing)!r} is not a directory"
                + ("" if existing == state_dir else f" (cannot create {str(state_dir)!r})")]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"agent.state_dir: {str(existing)!r} is not writable by this user"
                + ("" if existing == state_dir else f" (cannot create {str(state_dir)!r})")]
    return []


def _camera_modules(key: str, source: CameraConfig, snapshots: bool) -> list[str]:
    """The camera extra's modules a camera stream imports at start: OpenCV always (imported as
    ``run`` does, :func:`agent.sources.camera.quiet_opencv`), Pillow for an image folder and for
    snapshots. Without them ``run`` would pass the config and then end the stream (exit 69)."""
    from agent.sources.camera import quiet_opencv  # noqa: PLC0415

    problems: list[str] = []
    try:
        quiet_opencv()
    except SourceError as exc:
        problems.append(f"{key}.source: {exc}")
    needs_pillow = [why for why, needed in (("an image folder", source.folder is not None),
                                            ("[snapshots]", snapshots)) if needed]
    if needs_pillow and (missing := missing_module("PIL", "Pillow", "camera")):
        problems.append(f"{key}.source: {missing} (needed by {' and '.join(needs_pillow)})")
    return problems


def _uses_broker(config: AgentConfig) -> bool:
    """The ``[mqtt]`` broker settings are used: alerts, or the Sparkplug B connection."""
    return config.mqtt.enabled or config.mqtt.sparkplug.enabled


def _mqtt_consumers(config: AgentConfig) -> list[str]:
    """Home Assistant ids that collide, Sparkplug B without protobuf (``run`` refuses both)."""
    problems: list[str] = []
    if config.mqtt.enabled:
        from agent.publish.homeassistant import entity_id_part  # noqa: PLC0415

        seen: dict[str, str] = {}
        for sc in config.streams:
            part = entity_id_part(sc.name)
            if part in seen:
                problems.append(f"mqtt.homeassistant: streams {seen[part]!r} and {sc.name!r} "
                                f"both become Home Assistant id {part!r}; rename one")
            seen[part] = sc.name
    if config.mqtt.sparkplug.enabled:
        try:
            from google.protobuf import message  # noqa: F401, PLC0415
        except ImportError as exc:
            problems.append(f"mqtt.sparkplug.enabled: needs protobuf ({exc}); install "
                            "'edge-anomaly-agent[sparkplug]'")
    return problems


def _replay_columns(key: str, stream: str, source: ReplayConfig,
                    needed: tuple[str, ...]) -> list[str]:
    """The replay file's header as ``run`` reads it (time column, configured channels), and the
    model's channels among its columns (``run`` refuses the stream otherwise, exit 78)."""
    from agent.sources.replay import ReplaySource  # noqa: PLC0415

    try:
        columns = ReplaySource(source, stream).channels  # reads the header line only
    except SourceError as exc:
        return [f"{key}.source.path: {exc}"]
    missing = [c for c in needed if c not in columns]
    if missing:
        return [f"{key}.model: needs channels {missing} that the replay file does not provide "
                f"(its channels: {list(columns)})"]
    return []


def _credentials(config: AgentConfig) -> list[str]:
    """Read the credential files as ``run`` does (unreadable, not UTF-8, empty, writable by
    others, a client key that does not load: a problem).

    A token from an environment variable is not checked: the service's environment may differ
    from the shell's.
    """
    from agent.publish.mqtt import read_password  # noqa: PLC0415 - loads paho
    from agent.secret_files import check_trust_file, read_secret  # noqa: PLC0415
    from agent.services.uploader import read_token  # noqa: PLC0415

    problems: list[str] = []
    password_file = config.mqtt.password_file if _uses_broker(config) else None
    if password_file is not None and Path(password_file).is_file():
        try:
            read_password(password_file)
        except ConfigError as exc:
            problems.extend(exc.problems or [str(exc)])
    mqtt = config.mqtt
    tls_files = (mqtt.ca_file, mqtt.cert_file, mqtt.key_file, mqtt.key_password_file)
    if _uses_broker(config) and mqtt.tls and all(f is None or Path(f).is_file()
                                                 for f in tls_files):
        from agent.publish.mqtt_tls import tls_context  # noqa: PLC0415

        try:
            tls_context(mqtt)  # loads the CA, the client certificate and key as run does
        except ConfigError as exc:
            problems.extend(exc.problems or [str(exc)])
    for i, stream in enumerate(config.streams):  # the mqtt and opcua sources' passwords
        source_password = getattr(stream.source, "password_file", None)
        if isinstance(source_password, str) and Path(source_password).is_file():
            try:
                read_secret(source_password, f"streams[{i}].source.password_file", "password")
            except ConfigError as exc:
                problems.extend(exc.problems or [str(exc)])
    fleet = config.fleet
    if fleet.enabled and fleet.ca_file is not None and Path(fleet.ca_file).is_file():
        try:
            check_trust_file(fleet.ca_file, "fleet.ca_file")
            ssl.create_default_context(cafile=fleet.ca_file)
        except ConfigError as exc:
            problems.extend(exc.problems or [str(exc)])
        except (OSError, ssl.SSLError, ValueError) as exc:
            problems.append(f"fleet.ca_file: cannot load {fleet.ca_file!r}: {exc}")
    if fleet.enabled and fleet.token_file is not None and Path(fleet.token_file).is_file():
        try:
            read_token(fleet)
        except ConfigError as exc:
            problems.extend(exc.problems or [str(exc)])
    return problems
