"""MqttPublisher with a fake paho client: exact outbox semantics, config errors, logging."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pydantic
import pytest
from paho.mqtt.client import ConnectFlags, DisconnectFlags
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import CollectorRegistry

from agent.errors import ConfigError, StoreError
from agent.metrics import Metrics
from agent.publish.mqtt import MqttConfig, MqttPublisher
from agent.records import Alert
from agent.store.sqlite import Store

ALERTS = "edge/gw1/alerts"
AVAIL = "edge/gw1/availability"


class FakeInfo:
    def __init__(self, mid: int, rc: MQTTErrorCode) -> None:
        self.mid = mid
        self.rc = rc

    def wait_for_publish(self, timeout: float | None = None) -> None:
        return None


class FakeClient:
    """Records what the publisher does; the test fires paho's callbacks by hand."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.lock = threading.Lock()
        self.published: list[tuple[int, str, bytes, int, bool]] = []
        self.threads: dict[int, int] = {}  # mid -> the thread that published it
        self.is_up = False
        self.next_mid = 1
        self.calls: list[str] = []
        self.auth: tuple[str, str | None] | None = None
        self.will: tuple[str, str, int, bool] | None = None
        self.on_connect: Callable[..., None] | None = None
        self.on_connect_fail: Callable[..., None] | None = None
        self.on_disconnect: Callable[..., None] | None = None
        self.on_publish: Callable[..., None] | None = None

    # paho API used by the publisher
    def username_pw_set(self, username: str, password: str | None = None) -> None:
        self.auth = (username, password)

    def tls_set(self, ca_certs: str | None = None) -> None:
        self.calls.append("tls_set")

    def will_set(self, topic: str, payload: str, qos: int, retain: bool) -> None:
        self.will = (topic, payload, qos, retain)

    def reconnect_delay_set(self, min_delay: int, max_delay: int) -> None:
        self.calls.append(f"reconnect_delay_set({min_delay},{max_delay})")

    def max_inflight_messages_set(self, n: int) -> None:
        self.calls.append(f"max_inflight({n})")

    def connect_async(self, host: str, port: int, keepalive: int, **kw: Any) -> None:
        self.calls.append(f"connect_async({host},{port},{keepalive})")
        self.connect_kw = kw

    def socket(self) -> None:
        return None

    def loop_start(self) -> None:
        self.calls.append("loop_start")

    def loop_stop(self) -> None:
        self.calls.append("loop_stop")

    def disconnect(self) -> None:
        self.calls.append("disconnect")
        was_up, self.is_up = self.is_up, False
        if was_up and self.on_disconnect is not None:
            self.on_disconnect(self, None, DisconnectFlags(False), ReasonCode(
                PacketTypes.DISCONNECT, "Normal disconnection"), None)

    def publish(self, topic: str, payload: bytes | str, qos: int = 0,
                retain: bool = False) -> FakeInfo:
        data = payload.encode() if isinstance(payload, str) else payload
        with self.lock:
            mid, self.next_mid = self.next_mid, self.next_mid + 1
            self.published.append((mid, topic, data, qos, retain))
            self.threads[mid] = threading.get_ident()
            rc = MQTTErrorCode.MQTT_ERR_SUCCESS if self.is_up else MQTTErrorCode.MQTT_ERR_NO_CONN
        return FakeInfo(mid, rc)

    # test drivers
    def fire_connect(self) -> None:
        self.is_up = True
        assert self.on_connect is not None
        self.on_connect(self, None, ConnectFlags(False), ReasonCode(PacketTypes.CONNACK,
                                                                    "Success"), None)

    def fire_disconnect(self) -> None:
        self.is_up = False
        assert self.on_disconnect is not None
        self.on_disconnect(self, None, DisconnectFlags(False), ReasonCode(
            PacketTypes.DISCONNECT, "Unspecified error"), None)

    def fire_connect_fail(self) -> None:
        assert self.on_connect_fail is not None
        self.on_connect_fail(self, None)

    def ack(self, mid: int) -> None:
        """Acknowledge ``mid`` and, for an alert on the alerts topic, its copy on the
        stream's events topic (a broker acknowledges every message)."""
        assert self.on_publish is not None
        with self.lock:
            sent = {m: (t, p) for m, t, p, _, _ in self.published}
        self.on_publish(self, None, mid, ReasonCode(PacketTypes.PUBACK, "Success"), None)
        topic, payload = sent.get(mid, ("", b""))
        if topic == ALERTS:
            for m, (t, p) in sent.items():
                if m > mid and t.endswith("/events") and p == payload:
                    self.on_publish(self, None, m, ReasonCode(PacketTypes.PUBACK, "Success"),
                                    None)
                    break

    def alert_publishes(self) -> list[tuple[int, str]]:
        with self.lock:
            return [(m, json.loads(p)["alert_id"]) for m, t, p, _, _ in self.published
                    if t == ALERTS]


def wait_until(pred: Callable[[], bool], timeout_s: float = 3.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def alert(seq: int) -> Alert:
    return Alert(f"gw1:pump1:{seq}", "gw1", "pump1", seq, "ae", 1, 2.0, 1.0, 10.0, 11.0, 12.0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "agent.db")
    yield s
    s.close()


class Rig:
    def __init__(self, store: Store, **config: Any) -> None:
        self.registry = CollectorRegistry()
        self.clients: list[FakeClient] = []
        self.store = store

        def factory(**kw: Any) -> FakeClient:
            client = FakeClient(**kw)
            self.clients.append(client)
            return client

        self.pub = MqttPublisher(
            MqttConfig(**{"enabled": True, **config}),
            store,
            "gw1",
            Metrics(self.registry),
            client_factory=factory,
            logger=logging.getLogger("test.fake_mqtt"),
        )

    @property
    def client(self) -> FakeClient:
        return self.clients[0]

    def add(self, seq: int, received_mono: float | None = None) -> None:
        self.store.add_alert(alert(seq))
        self.pub.notify(f"gw1:pump1:{seq}", received_mono)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.registry.get_sample_value(name, labels or {}) or 0.0


@pytest.fixture
def rig(store: Store) -> Iterator[Rig]:
    r = Rig(store, max_inflight=3)
    yield r
    r.pub.stop()


def test_construction_configures_the_client(rig: Rig) -> None:
    c = rig.client
    assert c.kwargs["client_id"] == "edge-agent-gw1"
    assert c.kwargs["protocol"] == paho.MQTTv5 and "clean_session" not in c.kwargs
    assert c.will == (AVAIL, "offline", 1, True)
    assert "max_inflight(6)" in c.calls  # max_inflight = 3 alerts, two messages per raised
    assert "reconnect_delay_set(1,30)" in c.calls
    assert rig.pub.alerts_topic == ALERTS
    rig.pub.start()
    assert "connect_async(127.0.0.1,1883,30)" in c.calls and "loop_start" in c.calls
    assert c.connect_kw["clean_start"] is True


def test_mqtt_311_is_still_an_option(store: Store) -> None:
    r = Rig(store, protocol="3.1.1")
    c = r.client
    assert c.kwargs["protocol"] == paho.MQTTv311 and c.kwargs["clean_session"] is True
    r.pub.start()
    assert c.connect_kw == {}
    r.pub.stop()


def test_marked_published_only_on_puback(rig: Rig) -> None:
    rig.pub.start()
    rig.client.fire_connect()
    for seq in (1, 2, 3):
        rig.add(seq)
    wait_until(lambda: len(rig.client.alert_publishes()) == 3, what="3 publishes")
    mids = [m for m, _ in rig.client.alert_publishes()]
    assert rig.store.outbox_stats()[0] == 3
    rig.client.ack(mids[1])
    wait_until(lambda: rig.store.outbox_stats()[0] == 2, what="one row published")
    assert [r.alert_id for r in rig.store.pending_alerts(10)] == ["gw1:pump1:1", "gw1:pump1:3"]
    rig.client.ack(mids[0])
    rig.client.ack(mids[2])
    assert rig.pub.flush(3.0)
    assert rig.metric("edge_agent_mqtt_published_total") == 3


def test_window_limits_unacknowledged_publishes(rig: Rig) -> None:
    rig.pub.start()
    rig.client.fire_connect()
    for seq in range(1, 8):
        rig.add(seq)
    wait_until(lambda: len(rig.client.alert_publishes()) == 3, what="window filled")
    assert not rig.pub.flush(0.2)  # bounded wait: nothing more goes out without an ack
    assert len(rig.client.alert_publishes()) == 3
    for acked in range(1, 8):
        pubs = rig.client.alert_publishes()
        assert len(pubs) - (acked - 1) <= 3  # never more than max_inflight unacknowledged
        rig.client.ack(pubs[acked - 1][0])
        wait_until(
            lambda k=acked: len(rig.client.alert_publishes()) == min(k + 3, 7)
            and rig.store.outbox_stats()[0] == 7 - k,
            what=f"state after ack {acked}",
        )
    assert rig.pub.flush(3.0)
    assert [a for _, a in rig.client.alert_publishes()] == [f"gw1:pump1:{i}" for i in range(1, 8)]


def test_reconnect_leaves_in_flight_alerts_to_paho(rig: Rig) -> None:
    """After a reconnect paho re-sends the messages it holds (same mid, DUP); the drain sent
    them a second time (each in-flight alert twice on the new connection, three copies in
    all): now it only publishes what paho does not hold."""
    rig.pub.start()
    rig.client.fire_connect()
    for seq in (1, 2, 3):
        rig.add(seq)
    wait_until(lambda: len(rig.client.alert_publishes()) == 3, what="3 publishes")
    first = rig.client.alert_publishes()
    rig.client.ack(first[0][0])
    wait_until(lambda: rig.store.outbox_stats()[0] == 2, what="row 1 published")

    rig.client.fire_disconnect()
    rig.add(4)
    assert not rig.pub.flush(0.2)  # bounded wait: nothing is published while disconnected
    assert len(rig.client.alert_publishes()) == 3
    assert rig.metric("edge_agent_mqtt_disconnects_total") == 1
    assert rig.metric("edge_agent_mqtt_connected") == 0

    rig.client.fire_connect()
    wait_until(lambda: len(rig.client.alert_publishes()) == 4, what="the new alert")
    rig.pub.flush(0.2)
    again = rig.client.alert_publishes()[3:]
    assert [a for _, a in again] == ["gw1:pump1:4"]  # 2 and 3: paho's own re-sends
    for mid, _ in [*first[1:], *again]:
        rig.client.ack(mid)
    assert rig.pub.flush(3.0)
    assert rig.metric("edge_agent_mqtt_published_total") == 4
    avail = [p for _, t, p, _, _ in rig.client.published if t == AVAIL]
    assert avail == [b"online", b"online"]


class RefusingStore(Store):
    """A store whose ``mark_published`` fails while ``refuse`` is set (a full disk)."""

    refuse = False

    def mark_published(self, row_ids: Sequence[int], at: float) -> int:
        if self.refuse:
            raise StoreError("disk full: test", op="mark_published", path=self.path)
        return super().mark_published(row_ids, at)


def test_acks_the_store_cannot_save_do_not_stop_the_delivery(tmp_path: Path) -> None:
    """A full disk made every pass of the drain fail on saving the PUBACKs, and nothing more
    was published until the store took writes again (17 s in a tester's run), least of all
    the alerts the store had refused and that only MQTT could still deliver."""
    store = RefusingStore(tmp_path / "agent.db")
    r = Rig(store, max_inflight=3)
    try:
        r.pub.start()
        r.client.fire_connect()
        for seq in (1, 2, 3):
            r.add(seq)
        wait_until(lambda: len(r.client.alert_publishes()) == 3, what="3 publishes")
        store.refuse = True
        for mid, _ in r.client.alert_publishes():
            r.client.ack(mid)
        for seq in (4, 5):
            r.add(seq)
        assert r.pub.publish_volatile("gw1:pump1:6", "pump1", json.dumps(alert(6).to_payload()))
        wait_until(lambda: len(r.client.alert_publishes()) == 6, what="publishing goes on")
        assert [a for _, a in r.client.alert_publishes()][3:] == [
            "gw1:pump1:4", "gw1:pump1:5", "gw1:pump1:6"]
        for mid, _ in r.client.alert_publishes()[3:]:
            r.client.ack(mid)
        wait_until(lambda: len(r.pub.volatile) == 0, what="volatile alert acknowledged")
        assert store.outbox_stats()[0] == 5  # no acknowledgement saved yet
        store.refuse = False
        assert r.pub.flush(5.0)  # saved by a later pass (one try a second while failing)
        assert r.metric("edge_agent_mqtt_published_total") == 6
        assert len(r.client.alert_publishes()) == 6  # nothing sent twice
    finally:
        r.pub.stop()
        store.close()


def test_reconnect_does_not_resend_acknowledged_alerts_the_store_could_not_save(
    tmp_path: Path,
) -> None:
    """While the store refuses to save PUBACKs, the acknowledged rows stay pending in the outbox;
    a reconnect re-sent every one of them (52 stored alerts delivered 3 times over two broker
    restarts on a full 2 MiB tmpfs), not only the ``max_inflight`` the docstring allows."""
    store = RefusingStore(tmp_path / "agent.db")
    r = Rig(store, max_inflight=3)
    try:
        r.pub.start()
        r.client.fire_connect()
        store.refuse = True
        for seq in range(1, 9):
            r.add(seq)
            wait_until(lambda s=seq: len(r.client.alert_publishes()) == s, what=f"alert {seq}")
            r.client.ack(r.client.alert_publishes()[-1][0])
        wait_until(lambda: not r.pub._acks, what="acknowledgements taken")
        r.client.fire_disconnect()
        r.client.fire_connect()
        r.add(9)
        wait_until(lambda: len(r.client.alert_publishes()) > 8, what="the new alert")
        time.sleep(0.2)
        assert [a for _, a in r.client.alert_publishes()][8:] == ["gw1:pump1:9"]
        r.client.ack(r.client.alert_publishes()[-1][0])
        store.refuse = False
        assert r.pub.flush(5.0)
        assert r.metric("edge_agent_mqtt_published_total") == 9
    finally:
        r.pub.stop()
        store.close()


def test_latency_observed_on_first_puback(store: Store) -> None:
    r = Rig(store)
    clock = [50.0]
    r.pub._monotonic = lambda: clock[0]
    r.pub.start()
    r.client.fire_connect()
    r.add(1, received_mono=49.75)
    wait_until(lambda: len(r.client.alert_publishes()) == 1, what="publish")
    r.client.ack(r.client.alert_publishes()[0][0])
    wait_until(lambda: store.outbox_stats()[0] == 0, what="ack saved")
    labels = {"stream": "pump1"}
    assert r.metric("edge_agent_read_to_alert_seconds_count", labels) == 1
    assert r.metric("edge_agent_read_to_alert_seconds_sum", labels) == pytest.approx(0.25)
    r.pub._monotonic = time.monotonic
    r.pub.stop()


def test_loss_and_recovery_logged_once(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.fake_mqtt")
    rig.pub.start()
    for _ in range(3):
        rig.client.fire_connect_fail()
    rig.client.fire_connect()
    rig.client.fire_disconnect()
    for _ in range(3):
        rig.client.fire_connect_fail()
    rig.client.fire_connect()
    texts = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in t for t in texts) == 1
    assert sum("lost the MQTT broker" in t for t in texts) == 1
    assert sum("reachable again" in t for t in texts) == 2


def test_stop_publishes_offline_then_disconnects(rig: Rig) -> None:
    rig.pub.start()
    rig.client.fire_connect()
    rig.pub.stop()
    assert rig.client.published[-1][1:] == (AVAIL, b"offline", 1, True)
    assert rig.client.calls[-2:] == ["disconnect", "loop_stop"]
    assert rig.metric("edge_agent_mqtt_disconnects_total") == 0
    rig.pub.stop()  # idempotent


def test_disabled_publisher_does_not_connect(store: Store) -> None:
    r = Rig(store, enabled=False)
    r.pub.start()
    assert not any(c.startswith("connect_async") for c in r.client.calls)
    r.pub.stop()


def test_password_file(store: Store, tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    r = Rig(store, username="edge", password_file=str(secret))
    assert r.client.auth == ("edge", "s3cret")
    with pytest.raises(ConfigError, match=r"mqtt\.password_file"):
        Rig(store, username="edge", password_file=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        Rig(store, username="edge", password_file=str(tmp_path / "empty"))


def test_bad_device_id(store: Store) -> None:
    with pytest.raises(ConfigError, match="topic level"):
        MqttPublisher(MqttConfig(), store, "a/b", Metrics(CollectorRegistry()))


@pytest.mark.parametrize(
    "values",
    [
        {"qos": 0},
        {"qos": 2},
        {"host": "h", "hots": "typo"},
        {"ca_file": "/ca.pem"},
        {"password_file": "/pw"},
        {"reconnect_min_s": 10.0, "reconnect_max_s": 1.0},
        {"topic_prefix": "edge/#"},
        {"topic_prefix": "edge//x"},
        {"port": "1883"},
    ],
)
def test_config_rejects(values: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        MqttConfig(**values)


def test_every_config_field_is_described() -> None:
    assert all(f.description for f in MqttConfig.model_fields.values())


def test_a_password_over_plain_tcp_to_a_remote_broker_is_warned_about_once(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    pw.chmod(0o600)
    caplog.set_level(logging.WARNING, logger="test.fake_mqtt")
    rigs = [Rig(store, host=host, username="line1", password_file=str(pw))
            for host in ("broker.plant.example", "broker.plant.example", "127.0.0.1",
                         "localhost")]
    for r in rigs:  # a reload builds the publisher again: still one warning
        r.pub.start()
        r.pub.stop()
    texts = [r.getMessage() for r in caplog.records if "plain TCP" in r.getMessage()]
    assert len(texts) == 1 and "broker.plant.example" in texts[0], texts
    assert "secret" not in texts[0]


def test_retain_off_sends_availability_and_state_without_retain(store: Store) -> None:
    r = Rig(store, retain=False)
    try:
        assert r.client.will == (AVAIL, "offline", 1, False)
        assert r.pub.publish_latest("edge/gw1/pump1/state", b"{}") == "skipped"  # not connected
        r.pub.start()
        r.client.fire_connect()
        assert r.pub.publish_latest("edge/gw1/pump1/state", b"{}") == "retain_refused"
        assert r.pub.publish_latest("edge/gw1/pump1/state", b"") == "retain_refused"  # no removal
        sent = [(t, p, retain) for _, t, p, _, retain in r.client.published]
        assert (AVAIL, b"online", False) in sent
        assert ("edge/gw1/pump1/state", b"{}", False) in sent
        assert ("edge/gw1/pump1/state", b"", False) not in sent
    finally:
        r.pub.stop()


def test_a_broker_announcing_no_retain_turns_retain_off(rig: Rig) -> None:
    rig.pub.start()
    c = rig.client
    assert c.on_connect is not None
    props = type("Props", (), {"RetainAvailable": 0})()
    c.is_up = True
    c.on_connect(c, None, ConnectFlags(False), ReasonCode(PacketTypes.CONNACK, "Success"), props)
    assert rig.pub.retain is False
    assert rig.pub.publish_latest("edge/gw1/pump1/state", b"{}") == "retain_refused"
    assert (AVAIL, b"online", False) in [(t, p, ret) for _, t, p, _, ret in c.published]


def test_a_raised_event_goes_to_both_topics_and_leaves_the_outbox_on_both_acks(
    rig: Rig,
) -> None:
    rig.pub.start()
    rig.client.fire_connect()
    rig.add(1)
    events = "edge/gw1/pump1/events"
    wait_until(lambda: len(rig.client.published) >= 3, what="availability and two copies")
    mids = {t: m for m, t, _, _, _ in rig.client.published}
    assert set(mids) >= {ALERTS, events}
    assert rig.client.on_publish is not None
    rig.client.on_publish(rig.client, None, mids[events],
                          ReasonCode(PacketTypes.PUBACK, "Success"), None)
    assert not rig.pub.flush(0.3)  # the alerts topic's copy is not acknowledged yet
    rig.client.on_publish(rig.client, None, mids[ALERTS],
                          ReasonCode(PacketTypes.PUBACK, "Success"), None)
    assert rig.pub.flush(3.0)


def test_updated_and_cleared_go_to_the_events_topic_only(rig: Rig) -> None:
    rig.pub.start()
    rig.client.fire_connect()
    for seq, event in ((2, "updated"), (3, "cleared")):
        rig.store.add_alert(dataclasses.replace(alert(seq), event=event,
                                                episode_id="gw1:pump1:1", peak_score=3.0))
        rig.pub.notify(f"gw1:pump1:{seq}", None)
    events = "edge/gw1/pump1/events"
    wait_until(lambda: len([1 for _, t, *_ in rig.client.published if t == events]) == 2,
               what="two events")
    assert rig.client.alert_publishes() == []
    for m, t, *_ in list(rig.client.published):
        if t == events:
            rig.client.ack(m)
    assert rig.pub.flush(3.0)


def test_publish_early_hands_the_next_alert_to_paho_on_the_callers_thread(store: Store) -> None:
    """Publish while committing without waiting for the drain thread to wake: an early alert
    that nothing goes before is handed to paho by the thread that raised it; one behind a
    stored row not yet sent, or with no free in-flight slot, is left to the drain, in order;
    PUBACKs and commits are applied as for any early alert."""
    r = Rig(store, max_inflight=1)
    me = threading.get_ident()

    def early(seq: int) -> None:
        a = alert(seq)
        assert r.pub.publish_early(a.alert_id, "pump1", json.dumps(a.to_payload()))

    def commit(seq: int) -> None:
        a = alert(seq)
        rows = store.add_numbered_alerts([(a, json.dumps(a.to_payload()), None)])
        r.pub.committed([(a.alert_id, rows[0])])

    try:
        r.pub.start()
        r.client.fire_connect()
        wait_until(lambda: r.pub._drain_generation == r.pub.generation, what="drain caught up")
        early(1)
        sent = r.client.alert_publishes()  # no wait: published before publish_early returned
        assert [a for _, a in sent] == ["gw1:pump1:1"]
        assert r.client.threads[sent[0][0]] == me
        commit(1)
        r.add(2)  # a stored alert: no free slot while alert 1 is in flight
        early(3)  # the row of alert 2 goes first: left to the drain
        assert [a for _, a in r.client.alert_publishes()] == ["gw1:pump1:1"]
        r.client.ack(sent[0][0])
        wait_until(lambda: len(r.client.alert_publishes()) == 2, what="row 2 sent")
        r.client.ack(r.client.alert_publishes()[1][0])
        wait_until(lambda: len(r.client.alert_publishes()) == 3, what="alert 3 sent")
        pubs = r.client.alert_publishes()
        assert [a for _, a in pubs] == ["gw1:pump1:1", "gw1:pump1:2", "gw1:pump1:3"]
        assert r.client.threads[pubs[2][0]] != me  # sent by the drain thread
        r.client.ack(pubs[2][0])
        commit(3)
        assert r.pub.flush(5.0)  # every alert acknowledged and marked published
        assert store.outbox_stats()[0] == 0 and not len(r.pub.early)
        assert r.metric("edge_agent_mqtt_published_total") == 3
    finally:
        r.pub.stop()


class _WritingClient(FakeClient):
    """A client with paho's write callback whose network thread has already written what the
    caller queued (``want_write`` False) without calling back: paho queues the packet, wakes
    its thread, and marks the socket as wanting a write only afterwards, so a write done in
    between unregisters nothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._unregister: Callable[..., None] | None = None

    @property
    def on_socket_unregister_write(self) -> Callable[..., None] | None:
        return self._unregister

    @on_socket_unregister_write.setter
    def on_socket_unregister_write(self, func: Callable[..., None] | None) -> None:
        self._unregister = func

    def want_write(self) -> bool:
        return False


class _CountingEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_publish_early_does_not_wait_for_a_write_already_done(store: Store) -> None:
    """The raising thread waits for paho's write callback only while the packet is unwritten;
    one already written (its callback never comes) adds no wait."""
    clients: list[_WritingClient] = []

    def factory(**kw: Any) -> Any:  # a stand-in for paho.Client
        clients.append(_WritingClient(**kw))
        return clients[-1]

    pub = MqttPublisher(MqttConfig(enabled=True), store, "gw1", Metrics(CollectorRegistry()),
                        client_factory=factory, logger=logging.getLogger("test.fake_mqtt"))
    flushed = _CountingEvent()
    pub._flushed = flushed
    try:
        pub.start()
        clients[0].fire_connect()
        wait_until(lambda: pub._drain_generation == pub.generation, what="drain caught up")
        a = alert(1)
        assert pub.publish_early(a.alert_id, "pump1", json.dumps(a.to_payload()))
        assert [x for _, x in clients[0].alert_publishes()] == ["gw1:pump1:1"]
        assert pub._flush_hook and flushed.waits == 0
    finally:
        pub.stop()
