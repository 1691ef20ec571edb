"""The agent's process: logging, the state directory lock, /metrics, signals, and reload.

Reload (SIGHUP, ``systemctl reload``): :func:`check_reload` checks the config file again before
the running agent is replaced; :func:`run_with_reload` stops the running agent and builds the
next one from the new config in the same process (keeping /metrics), or from the previous
config when the new one cannot be built after all (module docstring of :mod:`agent.app`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Protocol

from agent import __version__
from agent.config.loader import load_config
from agent.config.schema import AgentConfig, resolve_model_path
from agent.errors import AgentError, ConfigError, ModelError, StoreError
from agent.httpd import OpsServer
from agent.inference.image_package import load_image_package
from agent.inference.package import load_package
from agent.logs import ALWAYS, reset_rate_limits, setup_logging
from agent.metrics import Metrics
from agent.monitor import Monitor
from agent.preflight import preflight
from agent.secret_files import private_umask, secure_state
from agent.sources.camera import CameraConfig
from agent.state_lock import lock_state_dir
from agent.systemd import Notifier

log = logging.getLogger("agent")


class RunningAgent(Protocol):
    """What the process needs of an agent (:class:`agent.app.Agent`)."""

    next_config: AgentConfig | None
    monitor: Monitor

    def run(self) -> int: ...

    def request_stop(self, reason: str = "stop requested") -> None: ...

    def request_reload(self) -> None: ...


class AgentFactory(Protocol):
    """Builds one agent (:class:`agent.app.Agent` itself)."""

    def __call__(self, config: AgentConfig, metrics: Metrics, *, notifier: Notifier,
                 reload: Callable[[], AgentConfig | None] | None) -> RunningAgent: ...


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


def metrics_bind_error(address: str, port: int, exc: OSError) -> AgentError:
    """The error for an ops endpoint that cannot be bound: a :class:`ConfigError` (exit 78)
    naming the key to change when the port is taken or the address is not local.

    >>> err = metrics_bind_error("127.0.0.1", 9851, OSError(errno.EADDRINUSE, "in use"))
    >>> isinstance(err, ConfigError), "set [agent] metrics_port" in err.problems[0]
    (True, True)
    """
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(f"cannot serve /metrics on {address}:{port}: in use", problems=[
            f"agent.metrics_port: {address}:{port} is already in use (another agent, or another "
            "program): set [agent] metrics_port to a free port, or stop what listens there"])
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(f"cannot serve /metrics on {address}:{port}: not local", problems=[
            f"agent.metrics_address: {address} is not an address of this host: set [agent] "
            "metrics_address (127.0.0.1, or 0.0.0.0 for every interface)"])
    return AgentError(f"cannot serve /metrics on {address}:{port}: {exc}")


def run_with_reload(config: AgentConfig, config_dir: Path, config_file: Path | None,
                    make_agent: AgentFactory) -> int:
    """CLI entry: resolve paths, set up logging, signals and /metrics, run the agent.

    SIGTERM and SIGINT stop; SIGHUP reloads ``config_file`` (see the module docstring; without
    a file, SIGHUP is logged and ignored).

    Args:
        config: The config as loaded (paths relative to ``config_dir``).
        config_dir: Where relative paths of ``config`` start.
        config_file: The file SIGHUP reads again, or None (the embedded default config).
        make_agent: Builds one agent (:class:`agent.app.Agent`).

    Returns:
        The last agent's exit code (:meth:`agent.app.Agent.run`).

    Raises:
        ConfigError, ModelError, StoreError: start-up failed (the CLI maps them to exit codes).
    """
    config = config.resolved(config_dir)
    problems = preflight(config)
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) in the configuration", problems=problems)
    setup_logging(config.agent.log_level, config.agent.log_format)
    state_lock = lock_state_dir(Path(config.agent.state_dir))  # held until the process exits
    metrics = Metrics()
    notifier = Notifier()
    current: list[RunningAgent] = []
    server: OpsServer | None = None
    if config.agent.metrics_port is not None:
        address, port = config.agent.metrics_address, config.agent.metrics_port
        try:
            server = OpsServer(
                metrics.registry,
                lambda: current[-1].monitor.report(),  # noqa: PLW0108 - the agent changes
                address,
                port,
                identity=lambda: {"device_id": config.agent.device_id, "version": __version__},
            )
        except OSError as exc:
            raise metrics_bind_error(address, port, exc) from exc
    stopping = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        log.info("signal %s received; stopping", name, extra=ALWAYS)
        stopping.set()
        if current:
            current[-1].request_stop(f"stopping on {name}")

    def _hup(signum: int, _frame: FrameType | None) -> None:
        if config_file is None:
            log.warning("SIGHUP ignored: running on the embedded default config (no file)",
                        extra=ALWAYS)
        elif current:
            log.info("SIGHUP received; checking %s", config_file, extra=ALWAYS)
            current[-1].request_reload()

    reload = (lambda: check_reload(config_file)) if config_file is not None else None
    previous: dict[signal.Signals, object] = {}
    for sig, handler in ((signal.SIGTERM, _stop), (signal.SIGINT, _stop),
                         (signal.SIGHUP, _hup)):
        previous[sig] = signal.signal(sig, handler)
    umask = private_umask()  # what the agent writes is 0600/0700 (agent.secret_files)
    secure_state(Path(config.agent.state_dir), Path(config.store.path))
    try:
        try:
            current.append(make_agent(config, metrics, notifier=notifier, reload=reload))
        except (ModelError, StoreError) as exc:
            log.error("cannot start: %s", exc)
            raise
        if server is not None:
            server.start()
        while True:
            agent = current[-1]
            if stopping.is_set():
                agent.request_stop("stopping on a signal received during the reload")
            code = agent.run()
            new = agent.next_config
            if new is None or stopping.is_set():
                if new is not None:
                    notifier.stopping()
                return code
            notifier.watchdog()  # the old agent stopped in time: progress
            reset_rate_limits()  # the restarted components' start lines are new events
            try:
                current.append(make_agent(new, metrics, notifier=notifier, reload=reload))
                config = new
            except AgentError as exc:
                log.error("reload failed (%s); starting again with the previous config", exc,
                          extra=ALWAYS)
                current.append(make_agent(config, metrics, notifier=notifier, reload=reload))
            del current[:-1]
    finally:
        if server is not None:
            server.stop()
        notifier.close()
        with contextlib.suppress(OSError):  # nothing buffered; the flock goes either way
            state_lock.close()  # releases the flock
        os.umask(umask)
        for sig, old_handler in previous.items():
            signal.signal(sig, old_handler)  # type: ignore[arg-type]
