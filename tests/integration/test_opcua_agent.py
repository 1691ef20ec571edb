"""PLC to alert over OPC UA: ``edge-agent sim-opcua`` serves SKAB valve1/0.csv as OPC UA
variables and ``edge-agent run`` with systemd/skab-opcua.toml subscribes to them and alerts.

Both are the real CLI in subprocesses (the quick start of docs/sources-opcua-mqtt.md, sped up
20x): the simulator's printed node list must be the example config's, and the shipped model
must raise an alert on the valve fault.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import _free_port
from tests.integration.test_agent_e2e import (
    AgentProcess,
    edge_agent,
    run_agent,
    skab_dir,
    wait_until,
)

pytest.importorskip("asyncua")
pytestmark = [pytest.mark.integration, pytest.mark.dataset]

__all__ = ["run_agent"]  # the fixture, imported for this module's tests

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "systemd" / "skab-opcua.toml"


def _node_ids(text: str) -> list[tuple[str, str]]:
    return re.findall(r'channel = "([^"]+)", node_id = "([^"]+)"', text)


def test_sim_opcua_to_an_alert(tmp_path: Path, run_agent: Callable[..., AgentProcess]) -> None:
    csv = skab_dir() / "valve1" / "0.csv"
    port = _free_port()
    sim = subprocess.Popen([*edge_agent(), "sim-opcua", "--csv", str(csv), "--port", str(port),
                            "--speed", "20", "--once"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(iter(sim.stdout.readline, "")),
                              daemon=True) if sim.stdout is not None else None
    assert reader is not None
    reader.start()
    try:
        wait_until(lambda: "]\n" in printed or sim.poll() is not None, 180,
                   "the simulator's node list", lambda: "".join(printed))
        assert sim.poll() is None, sim.stderr.read() if sim.stderr else ""
        example = EXAMPLE.read_text()
        assert _node_ids("".join(printed)) == _node_ids(example)  # the example reads the sim
        config = tmp_path / "agent.toml"
        config.write_text(example.replace("127.0.0.1:4840", f"127.0.0.1:{port}")
                          .replace("publishing_interval_ms = 100", "publishing_interval_ms = 25")
                          .replace('"../state/skab-opcua"', '"state"'))
        agent = run_agent(["run", "--config", str(config)], tmp_path)
        wait_until(lambda: ("pump1: source opcua" in agent.stderr()
                            or agent.proc.poll() is not None), 60, "the stream to start",
                   agent.stderr)
        assert agent.proc.poll() is None, agent.stderr()
        wait_until(lambda: "ALERT skab-opcua:pump1" in agent.stdout(), 150, "an alert",
                   lambda: agent.stderr()[-3000:])
        agent.terminate()
        assert agent.wait(30.0) == 0, agent.stderr()[-3000:]
    finally:
        sim.terminate()
        sim.wait(30)
        reader.join(10)
