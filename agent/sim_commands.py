"""``edge-agent sim-modbus`` and ``edge-agent sim-opcua``: a recorded CSV served in real time as
a Modbus device (:mod:`agent.sources.modbus_sim`) or an OPC UA server
(:mod:`agent.sources.opcua_sim`), so the whole path, PLC to alert, runs on one machine.

Each prints the source config that reads it (register map or node list), then serves until the
end of the file (``--once``) or SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from agent.errors import AgentError
from agent.exitcodes import EX_FAILURE, EX_OK


def sim_modbus(args: argparse.Namespace) -> int:
    """``sim-modbus``: channel i as float32 at holding registers 2i, 2i+1 of unit 1."""
    from agent.sources.modbus_sim import SimServer, serve_csv  # noqa: PLC0415
    from agent.sources.replay import ReplayConfig, ReplaySource  # noqa: PLC0415

    try:
        channels = ReplaySource(ReplayConfig(path=args.csv), "sim").channels
        server = SimServer(args.port, args.host, registers=max(256, 2 * len(channels)))
        server.start()
    except AgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EX_FAILURE
    print(f"serving {args.csv} on {args.host}:{args.port} (unit 1, holding registers, float32, "
          f"{args.speed:g}x); its register map, for [streams.source] kind = \"modbus\":")
    print("channels = [")
    for i, name in enumerate(channels):
        print(f'    {{ name = "{name}", address = {2 * i}, type = "float32" }},')
    print("]", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    try:
        serve_csv(server, args.csv, speed=args.speed, loop=not args.once, stop=stop)
    finally:
        server.stop()
    return EX_OK


def sim_opcua(args: argparse.Namespace) -> int:
    """``sim-opcua``: one Double variable per channel under ``Pump1``, security None."""
    from agent.sources.opcua_sim import OpcuaSimServer, serve_csv  # noqa: PLC0415
    from agent.sources.sim_replay import csv_channels  # noqa: PLC0415

    try:
        server = OpcuaSimServer(csv_channels(args.csv), args.port, args.host).start()
    except AgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EX_FAILURE
    print(f"serving {args.csv} on {server.endpoint} (security None, {args.speed:g}x); its "
          'nodes, for [streams.source] kind = "opcua":')
    print(f'endpoint = "{server.endpoint}"')
    print("nodes = [")
    for name in server.channels:
        print(f'    {{ channel = "{name}", node_id = "{server.node_id(name)}" }},')
    print("]", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    try:
        serve_csv(server, args.csv, speed=args.speed, loop=not args.once, stop=stop)
    except AgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EX_FAILURE
    finally:
        server.stop()
    return EX_OK
