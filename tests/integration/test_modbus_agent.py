"""PLC to alert: ``edge-agent run`` polls a pymodbus server that serves SKAB valve1/0.csv.

The server (:class:`agent.sources.modbus_sim.SimServer`, fed row by row by
:func:`agent.sources.modbus_sim.serve_csv` at 40x the recording's pace) runs in the test; the
agent is the real CLI in a subprocess with the shipped model. The server comes up once the
agent's stream has started, so calibration sees the recording's first rows however long the
agent took to start. Midway the server is stopped and started again: the agent reports the
outage, recovers by itself and goes on to alert on the valve fault.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.sources.modbus_sim import SimServer, serve_csv
from tests.conftest import _free_port
from tests.integration.test_agent_e2e import AgentProcess, run_agent, skab_dir, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.dataset]

__all__ = ["run_agent"]  # the fixture, imported for this module's tests


def test_run_polls_modbus_rides_out_a_restart_and_alerts(
    tmp_path: Path, run_agent: Callable[..., AgentProcess],
) -> None:
    csv = skab_dir() / "valve1" / "0.csv"
    example = (Path(__file__).resolve().parents[2] / "systemd" / "skab-modbus.toml").read_text()
    port = _free_port()
    config = tmp_path / "agent.toml"
    config.write_text(example.replace("port = 5020", f"port = {port}")
                      .replace("\npoll_interval_s = 0.1\n", "\npoll_interval_s = 0.025\n"
                               "reconnect_initial_s = 0.1\nreconnect_max_s = 0.5\n")
                      .replace('"../state/skab-modbus"', '"state"'))
    server = SimServer(port)
    stop = threading.Event()
    served: list[object] = []
    feeder = threading.Thread(target=serve_csv, args=(server, str(csv)),
                              kwargs={"speed": 40.0, "loop": False, "stop": stop,
                                      "on_row": served.append}, daemon=True)
    agent = run_agent(["run", "--config", str(config)], tmp_path)

    def count(text: str) -> int:
        return agent.stderr().count(text)

    try:
        wait_until(lambda: ("pump1: source modbus" in agent.stderr()
                            or agent.proc.poll() is not None), 60, "the stream to start",
                   agent.stderr)
        assert agent.proc.poll() is None, agent.stderr()
        # the PLC comes up once the agent polls (a loaded machine may take many seconds to
        # start the agent; rows served before would be lost and calibration would reach into
        # the fault): calibration sees the recording's first rows
        server.start()
        feeder.start()
        wait_until(lambda: len(served) >= 40 and count("source down") == count(
            "source recovered"), 30, "a second of polls", agent.stderr)
        downs, ups = count("source down"), count("source recovered")
        server.stop()
        wait_until(lambda: count("source down") > downs, 30, "the outage", agent.stderr)
        server.start()
        wait_until(lambda: count("source recovered") > ups, 30, "the recovery", agent.stderr)
        wait_until(lambda: "ALERT skab-modbus:pump1" in agent.stdout(), 90, "an alert",
                   lambda: agent.stderr()[-3000:])
    finally:
        stop.set()
        if feeder.is_alive():
            feeder.join(10.0)
        agent.terminate()
        agent.wait(30.0)
        server.stop()
