"""Clock steps through the real ``edge-agent`` process: two SKAB recordings replayed back to
back, the second stamped an hour earlier (a wall clock set back by NTP) or later, against the
same two with continuous timestamps.

Before: after the backward step no anomaly of the second recording alerted (the cooldown
compared timestamps) and the interval open at the step took every later reading into one "60 s"
aggregate. Now the step is logged once, the interval open at it is closed, and the alerts are
those of the continuous run.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_agent_e2e import (  # noqa: F401 - run_agent is a fixture
    AgentProcess,
    replay_source,
    run_agent,
    skab_dir,
    stored_aggregates,
    stored_alerts,
    write_config,
)

pytestmark = pytest.mark.integration

FIRST = SECOND = "valve1/0.csv"  # the same test twice: its anomalies alert in both
T0 = 1_700_000_000  # a multiple of 60


def back_to_back(dest: Path, step_s: int) -> tuple[Path, int]:
    """FIRST then SECOND at 1 Hz, SECOND's timestamps shifted by ``step_s``; and FIRST's rows."""
    out: list[str] = []
    t = T0
    n_first = 0
    for k, name in enumerate((FIRST, SECOND)):
        lines = (skab_dir() / name).read_text().splitlines()
        if k == 0:
            out.append(lines[0])
        else:
            t += step_s
        for row in lines[1:]:
            if row.strip():
                out.append(";".join([str(t), *row.split(";")[1:]]))
                t += 1
                n_first += k == 0
    dest.write_text("\n".join(out) + "\n")
    return dest, n_first


def run(tmp: Path, step_s: int, run_agent: Callable[..., AgentProcess]) -> tuple[  # noqa: F811
        AgentProcess, list[dict[str, object]], list[dict[str, object]], int]:
    tmp.mkdir()
    csv, n_first = back_to_back(tmp / "two.csv", step_s)
    config = write_config(tmp / "agent.toml", replay_source(csv, 0))
    agent = run_agent(["run", "--config", str(config)], tmp)
    assert agent.wait(90) == 0, agent.stderr()[-3000:]
    db = tmp / "state" / "agent.db"
    return agent, stored_alerts(db), stored_aggregates(db), n_first


@pytest.mark.parametrize("step_s", [-3600, 3600])
def test_a_clock_step_between_two_recordings(
    tmp_path: Path, run_agent: Callable[..., AgentProcess], step_s: int,  # noqa: F811
) -> None:
    _, want, _, n_first = run(tmp_path / "continuous", 0, run_agent)
    agent, got, aggs, _ = run(tmp_path / "stepped", step_s, run_agent)
    direction = "back" if step_s < 0 else "forward"
    stepped = [line for line in agent.stderr().splitlines() if "timestamps stepped" in line]
    # the jump minus the monotonic time between the two readings (about 0 at replay speed 0)
    assert len(stepped) == 1 and re.search(rf"stepped {direction} by 3(599|600|601)\.\d s",
                                           stepped[0]), stepped
    step_at = dt.datetime.fromtimestamp(T0 + n_first + step_s, dt.timezone.utc)
    assert step_at.strftime("%Y-%m-%dT%H:%M:%S") in stepped[0]
    # the same anomalies alert, in the second recording too
    n_second = sum(1 for a in want if a["payload"]["window_end"] >= _iso(T0 + n_first))  # type: ignore[index]
    assert n_second >= 1
    assert len(got) == len(want), ([a["payload"]["window_end"] for a in got],  # type: ignore[index]
                                   [a["payload"]["window_end"] for a in want])  # type: ignore[index]
    assert [a["payload"]["score"] for a in got] == [a["payload"]["score"] for a in want]  # type: ignore[index]
    # no interval absorbs more than its 60 s of readings; the one open at the step is closed
    assert max(int(a["count"]) for a in aggs) <= 60  # type: ignore[call-overload]
    assert sum(int(a["count"]) for a in aggs) == n_first + sum(  # type: ignore[call-overload]
        1 for row in (skab_dir() / SECOND).read_text().splitlines()[1:] if row.strip())


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
