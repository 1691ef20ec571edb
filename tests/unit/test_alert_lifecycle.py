"""Alert lifecycle, own logic: the pipeline's events, the store's open episodes, the episode
book (restart, ids of recorded inputs), the stream state feed and the retained-state publisher."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.pipeline.episodes import Lifecycle, UpdateParams
from agent.pipeline.event_ids import recorded_seq
from agent.pipeline.rules import AlertRules, RuleParams
from agent.pipeline.stream import AlertEvent
from agent.publish.state import StatePublisher
from agent.publish.stream_state import StateBoard, StreamState
from agent.records import FrameOrigin
from agent.services.episode_book import EpisodeBook, recorded_identity
from agent.services.stream_feed import StateFeed
from agent.sources.camera import CameraConfig
from agent.sources.replay import ReplayConfig
from agent.store.episodes import EpisodeMark
from agent.store.sqlite import Store
from tests.unit.test_store import make_alert
from tests.unit.test_stream import T0, feed, make_pipeline, splits, stream_with_step

# -- the pipeline -----------------------------------------------------------------------------


def test_an_episode_raises_updates_and_clears_with_one_peak() -> None:
    n = 1400
    x = stream_with_step(n, step_at=700, channel=1, seed=14)
    x[900:] = x[:500]  # the fault ends: normal readings again
    ts = T0 + np.arange(n, dtype=float)
    p = make_pipeline()
    p.lifecycle.params = UpdateParams(update_ratio=1.01, update_interval_s=0.0)
    events: list[AlertEvent] = []
    for a, b in zip(splits(n, "random", seed=3)[:-1], splits(n, "random", seed=3)[1:],
                    strict=True):
        events += p.process_block(x[a:b], ts[a:b]).events
    kinds = [e.kind for e in events]
    assert kinds[0] == "raised" and kinds[-1] == "cleared"
    assert set(kinds[1:-1]) <= {"updated"} and kinds.count("raised") == 1
    peaks = [e.peak_score for e in events[1:]]
    assert peaks == sorted(peaks)  # the peak never goes down
    assert events[-1].peak_score == max(e.score for e in events)
    assert events[-1].score < events[-1].threshold  # the clearing window is below
    assert events[-1].window_end >= T0 + 900


def test_alerts_stay_the_raised_events_only() -> None:
    n = 1000
    x = stream_with_step(n, step_at=700, channel=0, seed=14)
    r = feed(make_pipeline(), x, T0 + np.arange(n, dtype=float), [0, 500, n])
    assert [a.kind for a in r.alerts] == ["raised"]


def test_an_episode_the_cooldown_kept_from_raising_is_never_cleared() -> None:
    rules = AlertRules(RuleParams(k=1, n=1, clear_ratio=0.5, clear_windows=1, cooldown_s=100))
    life = Lifecycle(rules, UpdateParams(update_ratio=0))
    got = [life.step(s, 1.0, t) for t, s in enumerate([2, 0.1, 2, 0.1, 2])]
    assert got == ["raised", "cleared", None, None, None]


def test_without_episodes_every_alert_is_a_raised_that_nothing_follows() -> None:
    rules = AlertRules(RuleParams(k=1, n=1, clear_ratio=0.5, clear_windows=0, cooldown_s=0))
    life = Lifecycle(rules)
    assert [life.step(s, 1.0, t) for t, s in enumerate([2, 2, 0.1, 2])] == [
        "raised", "raised", None, "raised"]
    assert not life.open
    life.resume(5.0, 0.0)  # a stored episode of such a stream is not continued
    assert not life.open


def test_updates_are_rate_limited_in_stream_time() -> None:
    rules = AlertRules(RuleParams(k=1, n=1, clear_ratio=0.5, clear_windows=3, cooldown_s=0))
    life = Lifecycle(rules, UpdateParams(update_ratio=1.5, update_interval_s=10))
    got = [life.step(s, 1.0, t) for t, s in [(0, 2), (5, 4), (10, 4), (11, 9), (12, 9)]]
    assert got == ["raised", None, "updated", None, None]


def test_update_ratio_between_0_and_1_is_refused() -> None:
    with pytest.raises(ValueError, match="update_ratio"):
        UpdateParams(update_ratio=0.5)


# -- the store and the episode book ------------------------------------------------------------


def _event(kind: str = "raised", **kw: object) -> AlertEvent:
    base = AlertEvent("pump1", 7.0, 5.0, T0, T0 + 9, (), 0.0)
    return dataclasses.replace(base, kind=kind, **kw)  # type: ignore[arg-type]


def test_the_store_keeps_an_episode_open_from_its_raised_to_its_cleared(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.db")
    store.add_new_alert("pump1", make_alert,
                        episode=EpisodeMark(open=True, peak_score=2.5, reported_ts=T0))
    [ep] = store.open_episodes().values()
    assert (ep.episode_id, ep.peak_score, ep.reported_ts) == ("gw1:pump1:1", 2.5, T0)
    store.add_new_alert("pump1", lambda seq: dataclasses.replace(
        make_alert(seq), event="updated", episode_id="gw1:pump1:1", peak_score=4.0),
        episode=EpisodeMark(peak_score=4.0, reported_ts=T0 + 5))
    assert store.open_episodes()["pump1"].peak_score == 4.0
    store.close()
    store = Store(tmp_path / "a.db")  # a restart finds it
    assert store.open_episodes()["pump1"].episode_id == "gw1:pump1:1"
    store.add_new_alert("pump1", lambda seq: dataclasses.replace(
        make_alert(seq), event="cleared", episode_id="gw1:pump1:1", peak_score=4.0),
        episode=EpisodeMark(close=True, peak_score=4.0))
    assert store.open_episodes() == {}
    events = [a["payload"]["event"] for a in store.alerts()]
    assert events == ["raised", "updated", "cleared"]


def test_the_book_continues_stored_episodes_and_forgets_those_of_removed_streams(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "a.db")
    store.add_alert(make_alert(1), EpisodeMark(open=True, peak_score=8.0, reported_ts=T0))
    store.add_alert(make_alert(1, stream="gone"), EpisodeMark(open=True, peak_score=3.0))
    rules = AlertRules(RuleParams(k=1, n=1, clear_ratio=0.5, clear_windows=2, cooldown_s=0))
    life = Lifecycle(rules)
    book = EpisodeBook({"pump1": None})
    book.restore(store, {"pump1": life})
    assert book.open == {"pump1": "gw1:pump1:1"} and life.open and life.peak == 8.0
    assert set(store.open_episodes()) == {"pump1"}
    assert [life.step(s, 1.0, T0 + t) for t, s in enumerate([0.1, 0.1])] == [None, "cleared"]
    plan = book.plan(_event("cleared", peak_score=8.0), episodic=True)
    assert plan is not None and plan.episode_id == "gw1:pump1:1" and plan.mark.close
    book.stored(_event("cleared"), "gw1:pump1:2", plan)
    assert book.open == {}
    assert book.plan(_event("cleared"), episodic=True) is None  # no episode open


def test_a_recorded_replay_gets_the_same_ids_each_time_a_live_source_its_next_seq() -> None:
    replay = ReplayConfig(path="/data/skab/valve1/0.csv")
    assert recorded_identity(replay) == "replay:0.csv"
    assert recorded_identity(ReplayConfig(path="x.csv", restamp=True)) is None
    assert recorded_identity(ReplayConfig(path="x.csv", loop=True)) is None
    assert recorded_identity(CameraConfig(folder="parts")) == "camera"
    assert recorded_identity(CameraConfig(folder="parts", watch=True)) is None
    assert recorded_identity(CameraConfig(device=0)) is None
    first = EpisodeBook({"pump1": "replay:0.csv"}).plan(_event(), episodic=True)
    again = EpisodeBook({"pump1": "replay:0.csv"}).plan(_event(), episodic=True)
    assert first is not None and again is not None and first.seq == again.seq
    assert first.seq == recorded_seq("replay:0.csv", "raised", round(T0 * 1000))
    assert 0 <= first.seq < 2**62
    live = EpisodeBook({"pump1": None}).plan(_event(), episodic=True)
    assert live is not None and live.seq is None
    cam = EpisodeBook({"pump1": "camera"})
    a = cam.plan(_event(origin=FrameOrigin("crack_01.png")), episodic=False)
    b = cam.plan(_event(origin=FrameOrigin("crack_02.png")), episodic=False)
    assert a is not None and b is not None and a.seq != b.seq and not a.mark.open


def test_a_replayed_event_is_stored_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.db")
    alert = dataclasses.replace(make_alert(recorded_seq("replay:0.csv", "raised", 1)))
    assert store.add_alert(alert, EpisodeMark(open=True)) is True
    assert store.add_alert(alert, EpisodeMark(open=True)) is False
    assert len(store.alerts()) == 1


# -- the state feed and the retained-state publisher -------------------------------------------


def _metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def test_the_feed_derives_the_status_and_sets_the_gauges() -> None:
    board, m = StateBoard(), _metrics()
    feed_ = StateFeed(board, m, clock=lambda: 100.0)
    feed_.add("pump1", "sensor", "skab", 2, None)
    assert board.get("pump1").status == "calibrating"  # type: ignore[union-attr]
    feed_.scored("pump1", 1.0, 5.0)
    assert board.get("pump1").status == "normal"  # type: ignore[union-attr]
    feed_.episode("pump1", "gw1:pump1:7")
    state = board.get("pump1")
    assert state is not None and (state.status, state.episode_id) == ("anomalous",
                                                                      "gw1:pump1:7")
    feed_.health({"pump1": "red"})
    assert board.get("pump1").status == "down"  # type: ignore[union-attr]
    feed_.health({"pump1": "yellow"})
    feed_.episode("pump1", None)
    assert board.get("pump1").status == "degraded"  # type: ignore[union-attr]
    r = m.registry
    assert r.get_sample_value("edge_agent_stream_score", {"stream": "pump1"}) == 1.0
    assert r.get_sample_value("edge_agent_stream_threshold", {"stream": "pump1"}) == 5.0
    assert r.get_sample_value("edge_agent_stream_anomaly_active", {"stream": "pump1"}) == 0


class Sink:
    def __init__(self) -> None:
        self.generation = 1
        self.connected = True
        self.sent: list[tuple[str, bytes]] = []

    def state_topic(self, stream: str) -> str:
        return f"edge/gw1/{stream}/state"

    def publish_latest(self, topic: str, payload: bytes) -> str:
        if not self.connected:
            return "skipped"
        self.sent.append((topic, payload))
        return "published"


def _state(score: float, status: str = "normal") -> StreamState:
    return StreamState("pump1", "sensor", status, score, 5.0, "skab", 2, None, 0.0)  # type: ignore[arg-type]


def test_score_only_changes_wait_for_the_interval_status_changes_do_not() -> None:
    now = [0.0]
    board, sink = StateBoard(), Sink()
    pub = StatePublisher(board, sink, _metrics(), interval_s=10.0, monotonic=lambda: now[0])
    board.update(_state(1.0))
    pub.publish_due()
    board.update(_state(2.0))
    now[0] = 5.0
    pub.publish_due()
    assert [json.loads(p)["score"] for _, p in sink.sent] == [1.0]
    board.update(_state(3.0))
    board.update(_state(3.0, "anomalous"))  # a status change goes out at once
    pub.publish_due()
    assert [json.loads(p)["status"] for _, p in sink.sent] == ["normal", "anomalous"]
    board.update(_state(4.0, "anomalous"))
    now[0] = 15.1
    pub.publish_due()  # the interval passed: the latest score, not a backlog
    assert [json.loads(p)["score"] for _, p in sink.sent] == [1.0, 3.0, 4.0]


def test_a_reconnect_sends_every_state_again_and_a_removal_clears_the_retained_copy() -> None:
    board, sink = StateBoard(), Sink()
    pub = StatePublisher(board, sink, _metrics(), interval_s=10.0, monotonic=lambda: 0.0)
    board.update(_state(1.0))
    pub.publish_due()
    sink.connected = False
    board.update(_state(1.0, "down"))
    pub.publish_due()  # not connected: held
    sink.connected, sink.generation = True, 2
    pub.publish_due()
    assert [json.loads(p)["status"] for _, p in sink.sent] == ["normal", "down"]
    pub.publish_due()
    assert len(sink.sent) == 2
    sink.generation = 3  # a new connection (the broker may have lost its retained copies)
    pub.publish_due()
    assert len(sink.sent) == 3
    board.remove("pump1")
    pub.stop()
    assert sink.sent[-1] == ("edge/gw1/pump1/state", b"")
