"""The ``edge-agent`` command line.

Commands::

    edge-agent run [--config FILE]        run the agent (no --config: the embedded defaults)
    edge-agent check-config FILE          validate a config; print every problem
    edge-agent print-default-config       the default config as commented TOML
    edge-agent status [--url URL | --config FILE]   a running agent's /healthz, readably
    edge-agent probe [--config FILE] [--stream NAME] [--seconds N] [--json]
                                          read the sources only: readings, rejections, outages
    edge-agent sim-modbus --csv FILE [--port N]   serve a recorded CSV as Modbus registers
    edge-agent sim-opcua --csv FILE [--port N]    serve a recorded CSV as OPC UA variables
    edge-agent models                     the builtin model packages and where they resolve
    edge-agent version                    print the version

Exit codes (:mod:`agent.exitcodes`): 0 success, 78 (``EX_CONFIG``) invalid configuration,
69 (``EX_UNAVAILABLE``) ``run``: every source has ended and at least one failed for good,
1 any other failure, 130 interrupted (Ctrl-C); ``status`` exits 0 green, 1 yellow, 2 red,
3 unreachable, 4 another agent (another ``device_id``) answers on ``--config``'s port.
systemd's ``RestartPreventExitStatus=78`` keeps a unit with a broken config from restarting in
a loop; 69 is restarted (``Restart=on-failure``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from agent import __version__, native_threads
from agent.config.loader import dump_default_config, load_config
from agent.config.schema import AgentConfig, default_config
from agent.errors import AgentError, ConfigError
from agent.exitcodes import (  # noqa: F401 - EX_UNAVAILABLE: re-exported with the others
    EX_CONFIG,
    EX_FAILURE,
    EX_INTERRUPTED,
    EX_OK,
    EX_UNAVAILABLE,
)

#: ``status`` exit codes by overall health; ``STATUS_UNREACHABLE`` when /healthz cannot be read;
#: ``STATUS_OTHER_AGENT`` when ``--config``'s port answers with another device_id.
STATUS_EXIT = {"green": 0, "yellow": 1, "red": 2}
STATUS_UNREACHABLE = 3
STATUS_OTHER_AGENT = 4
DEFAULT_STATUS_PORT = 9851


def main(argv: list[str] | None = None) -> int:
    """Run one ``edge-agent`` command.

    Args:
        argv: Arguments without the program name; ``None`` = ``sys.argv[1:]``: the program
            itself, which then ends through :func:`agent.native_threads.finish` (a thread
            still inside native code after a bounded join ends the process with
            ``os._exit`` and this exit code, never with the C++ runtime's abort).

    Returns:
        The process exit code (see the module docstring).
    """
    code = _main(argv)
    return native_threads.finish(code) if argv is None else code


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func
    try:
        return command(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EX_INTERRUPTED
    except BrokenPipeError:  # e.g. `edge-agent status | head -1`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EX_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Edge anomaly-detection agent for factory gateways."
    )
    parser.add_argument("--version", action="version", version=f"edge-agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the agent")
    run.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML config file (default: the embedded defaults: one simulator stream, "
        "console alerts, no broker)",
    )
    run.add_argument(
        "--log-format",
        choices=["auto", "text", "journal", "json"],
        help="overrides agent.log_format: journal = sd-daemon priority prefixes and no "
        "timestamp, auto = journal under systemd's journal stream, else text",
    )
    run.set_defaults(func=_cmd_run)

    check = sub.add_parser("check-config", help="validate a config file and print every problem")
    check.add_argument("file", type=Path, metavar="FILE")
    check.set_defaults(func=_cmd_check_config)

    dump = sub.add_parser("print-default-config", help="print the default config as commented TOML")
    dump.set_defaults(func=_cmd_print_default_config)

    status = sub.add_parser(
        "status",
        help="show a running agent's health (exit 0 green, 1 yellow, 2 red, 3 unreachable, "
        "4 --config's port answered by an agent with another device_id)",
    )
    status.add_argument(
        "--url", metavar="URL", help="the agent's base URL (default http://127.0.0.1:PORT, "
        f"PORT from --config's agent.metrics_port; without --config {DEFAULT_STATUS_PORT})",
    )
    status.add_argument("--config", type=Path, metavar="FILE", help="the agent's config file")
    status.add_argument("--timeout", type=float, default=5.0, metavar="S", help="seconds")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.set_defaults(func=_cmd_status)

    probe = sub.add_parser(
        "probe", help="open the sources and print what they read (no scoring, no publishing; "
        "exit 1 when a stream read nothing)")
    probe.add_argument("--config", type=Path, metavar="FILE",
                       help="TOML config file (default: the embedded defaults)")
    probe.add_argument("--stream", metavar="NAME", help="only this stream")
    probe.add_argument("--seconds", type=_positive, default=5.0, metavar="N",
                       help="how long to read (default 5)")
    probe.add_argument("--json", action="store_true", help="one JSON object per line")
    probe.set_defaults(func=_cmd_probe)

    sim = sub.add_parser(
        "sim-modbus", help="serve a recorded CSV (SKAB layout) as Modbus TCP holding registers "
        "in real time: channel i as float32 at registers 2i, 2i+1 of unit 1")
    _add_replay_server_args(sim, port=5020)
    sim.set_defaults(func=_cmd_sim_modbus)

    simua = sub.add_parser(
        "sim-opcua", help="serve a recorded CSV (SKAB layout) as OPC UA variables in real time: "
        "one Double per channel, ns=<ns>;s=Pump1.<name>, security None")
    _add_replay_server_args(simua, port=4840)
    simua.set_defaults(func=_cmd_sim_opcua)

    models = sub.add_parser(
        "models", help="list the builtin: model packages and the directory each resolves to"
    )
    models.set_defaults(func=_cmd_models)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)
    return parser


def _add_replay_server_args(parser: argparse.ArgumentParser, port: int) -> None:
    """The options ``sim-modbus`` and ``sim-opcua`` share: the recording, where to serve it
    (``port``: the protocol's usual port) and its pace."""
    parser.add_argument("--csv", required=True, metavar="FILE", help="the recording")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=port, help=f"TCP port (default {port})")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="1 = the file's own pace, N = N times faster (default 1)")
    parser.add_argument("--once", action="store_true", help="stop at the end of the file")


def _load(config_file: Path | None) -> tuple[AgentConfig, Path]:
    """The config (the embedded defaults without a file) and its directory.

    Raises:
        ConfigError: The file does not load.
    """
    if config_file is None:
        return default_config(), Path.cwd()
    return load_config(config_file), config_file.resolve().parent


def _cmd_run(args: argparse.Namespace) -> int:
    config_file: Path | None = args.config
    try:
        config, config_dir = _load(config_file)
    except ConfigError as exc:
        return _report_config_error(exc, config_file, sys.stderr)
    if args.log_format is not None:
        agent = config.agent.model_copy(update={"log_format": args.log_format})
        config = config.model_copy(update={"agent": agent})
    try:
        app = importlib.import_module("agent.app")
    except ModuleNotFoundError as exc:
        if exc.name != "agent.app":
            raise
        print(
            "error: agent.app (the composition root) is not available in this build",
            file=sys.stderr,
        )
        return EX_FAILURE
    try:
        result = app.run(config, config_dir, config_file)
    except ConfigError as exc:
        return _report_config_error(exc, config_file, sys.stderr)
    except AgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EX_FAILURE
    return result if isinstance(result, int) else EX_OK


def _cmd_check_config(args: argparse.Namespace) -> int:
    config_file: Path = args.file
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        return _report_config_error(exc, config_file, sys.stderr)
    from agent.preflight import preflight  # noqa: PLC0415 - loads the model code

    resolved = config.resolved(config_file.resolve().parent)
    problems = preflight(resolved)
    if problems:
        error = ConfigError(f"{len(problems)} problem(s)", problems=problems)
        return _report_config_error(error, config_file, sys.stderr)
    print(f"OK: {summarize(config)}")
    print(f"store: {resolved.store.path}")  # where run keeps alerts and aggregates
    return EX_OK


def _cmd_print_default_config(args: argparse.Namespace) -> int:
    sys.stdout.write(dump_default_config())
    return EX_OK


def _cmd_status(args: argparse.Namespace) -> int:
    url: str | None = args.url
    expected: str | None = None  # the device_id --config names
    if url is None:
        host, port = "127.0.0.1", DEFAULT_STATUS_PORT
        if args.config is not None:
            try:
                agent = load_config(args.config).agent
            except ConfigError as exc:
                return _report_config_error(exc, args.config, sys.stderr)
            if agent.metrics_port is None:  # probing the default port could find another agent
                print(f"error: {args.config} sets no agent.metrics_port: that agent serves no "
                      "/healthz to ask (set one, or give --url)", file=sys.stderr)
                return STATUS_UNREACHABLE
            port, expected = agent.metrics_port, agent.device_id
            if agent.metrics_address not in {"0.0.0.0", "::"}:  # noqa: S104 - compared, not bound
                host = agent.metrics_address
        url = f"http://{host}:{port}"
    target = url.rstrip("/") + "/healthz"
    if not target.startswith(("http://", "https://")):
        print(f"error: not an http(s) URL: {url}", file=sys.stderr)
        return STATUS_UNREACHABLE
    try:
        with urllib.request.urlopen(target, timeout=args.timeout) as resp:  # noqa: S310
            raw = resp.read()
    except urllib.error.HTTPError as exc:  # 503 = red, still a report
        raw = exc.read()
    except (OSError, ValueError) as exc:
        print(f"edge-agent at {url}: unreachable ({exc})", file=sys.stderr)
        return STATUS_UNREACHABLE
    try:
        body = json.loads(raw)
        overall = str(body["status"])
    except (ValueError, KeyError, TypeError):
        overall = ""
    if overall not in STATUS_EXIT:  # another service's /healthz, e.g. edge-fleet's {"status": "ok"}
        print(f"edge-agent at {url}: not an edge-agent health report: {raw[:200]!r}",
              file=sys.stderr)
        return STATUS_UNREACHABLE
    answered = body.get("device_id")
    if expected is not None and answered is None:  # an agent older than /healthz's device_id
        print(f"edge-agent at {url}: names no device_id; cannot check it is {expected!r}",
              file=sys.stderr)
    elif expected is not None and answered != expected:
        print(f"edge-agent at {url}: another agent answers (device_id {answered!r}, not "
              f"{expected!r} of {args.config}): is {expected!r} running? Give one of them "
              "another [agent] metrics_port", file=sys.stderr)
        return STATUS_OTHER_AGENT
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(format_health(url, body))
    return STATUS_EXIT.get(overall, STATUS_EXIT["red"])


def format_health(url: str, body: dict[str, object]) -> str:
    """The ``/healthz`` body as lines: overall first, then one line per component; a component
    disabled in the config (``"enabled": false``, e.g. MQTT) shows as ``off``, not green.

    >>> print(format_health("http://h:1", {"status": "yellow", "components": {
    ...     "pipeline": {"state": "green", "reason": None},
    ...     "calibration": {"state": "yellow", "reason": "calibrating: a"},
    ...     "mqtt": {"state": "green", "reason": None, "enabled": False}}}))
    edge-agent at http://h:1: YELLOW
      green   pipeline
      yellow  calibration      calibrating: a
      off     mqtt             disabled in the config
    """
    who = "".join(f", {k} {body[k]}" for k in ("device_id", "version") if k in body)
    lines = [f"edge-agent at {url}: {str(body.get('status')).upper()}"
             + (f" ({who[2:]})" if who else "")]
    comps = body.get("components")
    if isinstance(comps, dict):
        for name, comp in comps.items():
            state = comp.get("state", "?") if isinstance(comp, dict) else "?"
            reason = comp.get("reason") if isinstance(comp, dict) else None
            if isinstance(comp, dict) and comp.get("enabled") is False:
                state, reason = "off", reason or "disabled in the config"
            line = f"  {state:<7} {name}"
            if reason:
                line = f"{line:<26} {reason}"
            lines.append(line)
    return "\n".join(lines)


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def _cmd_probe(args: argparse.Namespace) -> int:
    from agent.probe import probe  # noqa: PLC0415

    config_file: Path | None = args.config
    try:
        config, config_dir = _load(config_file)
        return probe(config.resolved(config_dir), sys.stdout, stream=args.stream,
                     seconds=args.seconds, as_json=args.json)
    except ConfigError as exc:
        return _report_config_error(exc, config_file, sys.stderr)


def _cmd_sim_modbus(args: argparse.Namespace) -> int:
    from agent.sim_commands import sim_modbus  # noqa: PLC0415 - pymodbus only for this command

    return sim_modbus(args)


def _cmd_sim_opcua(args: argparse.Namespace) -> int:
    from agent.sim_commands import sim_opcua  # noqa: PLC0415 - asyncua only for this command

    return sim_opcua(args)


def _cmd_models(args: argparse.Namespace) -> int:
    """One line per builtin package: ``builtin:NAME  version V  KIND  DIRECTORY``, then one per
    known package not found (``builtin:mtd-patchcore  not found: ...`` from a wheel)."""
    from agent.config.builtin_models import (  # noqa: PLC0415 - this command only
        absent_builtins,
        available_builtins,
        how_to_get,
    )

    found = available_builtins()
    for name, path in found.items():
        try:
            manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
            about = f"version {manifest.get('version', '?')}  {manifest.get('kind', '?')}"
        except (OSError, ValueError, AttributeError) as exc:
            about = f"unreadable manifest ({exc})"
        print(f"builtin:{name}  {about}  {path}")
    for name in absent_builtins():
        print(f"builtin:{name}  not found: {how_to_get(name)}")
    if not found:
        print("no builtin model packages found (docs/install.md: where they come from)",
              file=sys.stderr)
        return EX_FAILURE
    return EX_OK


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"edge-agent {__version__}")
    return EX_OK


def _report_config_error(exc: ConfigError, config_file: Path | None, out: TextIO) -> int:
    """Print every problem, one per line, prefixed with the file name; return 78."""
    prefix = f"{config_file}: " if config_file is not None else ""
    for problem in exc.problems or [str(exc)]:
        print(f"{prefix}{problem}", file=out)
    return EX_CONFIG


def summarize(config: AgentConfig) -> str:
    """One line describing a config, e.g. for ``check-config``.

    >>> summarize(default_config())
    "device 'edge-demo', 1 stream (demo: simulator, 8 channels), mqtt off, metrics off, fleet off"
    """
    streams = ", ".join(
        f"{s.name}: {s.source.kind}"
        + (f", {len(ch)} channels" if (ch := getattr(s.source, "channels", None)) else "")
        for s in config.streams
    )
    count = len(config.streams)
    mqtt = f"mqtt {config.mqtt.host}:{config.mqtt.port}" if config.mqtt.enabled else "mqtt off"
    port = config.agent.metrics_port
    metrics = f"metrics :{port}" if port is not None else "metrics off"
    noun = "stream" if count == 1 else "streams"
    fleet = "fleet off"
    if config.fleet.enabled:
        fleet = f"fleet {config.fleet.url}" + (
            ", model updates on" if config.updater.enabled else ", model updates off")
    return (f"device '{config.agent.device_id}', {count} {noun} ({streams}), {mqtt}, {metrics}, "
            f"{fleet}")


if __name__ == "__main__":
    sys.exit(main())
