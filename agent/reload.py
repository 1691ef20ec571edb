"""Reload (SIGHUP, ``systemctl reload``): check the config file again before the running agent
is replaced (the restart itself: :func:`agent.app.run`)."""

from __future__ import annotations

import logging
from pathlib import Path

from agent.config.loader import load_config
from agent.config.schema import AgentConfig, resolve_model_path
from agent.errors import AgentError, ConfigError
from agent.inference.image_package import load_image_package
from agent.inference.package import load_package
from agent.logs import ALWAYS
from agent.sources.camera import CameraConfig

log = logging.getLogger("agent")


def check_reload(config_file: Path) -> AgentConfig | None:
    """Read and check ``config_file`` for a reload: schema, paths, every model package loads.

    Returns:
        The resolved config, or None when invalid (every problem is logged at ERROR).
    """
    try:
        config = load_config(config_file).resolved(config_file.resolve().parent)
        for sc in config.streams:
            path = resolve_model_path(sc.model, Path.cwd())
            if isinstance(sc.source, CameraConfig):
                load_image_package(path)
            else:
                load_package(path)
    except ConfigError as exc:
        for problem in exc.problems or [str(exc)]:
            log.error("reload refused: %s: %s", config_file, problem, extra=ALWAYS)
        return None
    except AgentError as exc:
        log.error("reload refused: %s: %s", config_file, exc, extra=ALWAYS)
        return None
    log.info("reload: %s is valid; restarting the agent's components with it", config_file,
             extra=ALWAYS)
    return config
