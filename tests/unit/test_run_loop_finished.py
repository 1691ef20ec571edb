"""Which streams the heartbeat reports as ``finished`` (agent.run_loop): a camera whose input
ended (exhausted), not one whose thread ended because the agent is stopping."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agent.health import Component, Report
from agent.run_loop import AgentLoop


def _loop(cameras: dict[str, Any]) -> tuple[Any, list[frozenset[str]]]:
    seen: list[frozenset[str]] = []
    report = Report(tuple(Component(f"source:{n}", "green") for n in cameras), 1.0)
    loop = SimpleNamespace(
        metrics=SimpleNamespace(queue_depth=SimpleNamespace(set=lambda _v: None)),
        queue=SimpleNamespace(qsize=lambda: 0),
        monitor=SimpleNamespace(tick=lambda _n: report),
        alerts_raised=0, streams={}, cameras=cameras,
        feed=SimpleNamespace(scored=lambda *_a: None,
                             health=lambda _states, finished: seen.append(finished)),
    )
    return loop, seen


def _camera(done: bool, exhausted: bool, error: object = None) -> Any:
    return SimpleNamespace(done=done, exhausted=exhausted, error=error, last_score=None,
                           pipeline=SimpleNamespace(threshold=1.0))


def test_a_stopped_live_camera_is_not_finished_an_ended_file_is() -> None:
    loop, seen = _loop({"live": _camera(done=True, exhausted=False),
                        "file": _camera(done=True, exhausted=True),
                        "broken": _camera(done=True, exhausted=False, error="bad")})
    AgentLoop._heartbeat(loop)
    assert seen == [frozenset({"file"})]
