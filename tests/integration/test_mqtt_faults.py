"""MqttPublisher against a real mosquitto behind faults: lost PUBACKs, no CONNACK, size limits.

The faults come from a small proxy (:mod:`tests.integration.mqtt_proxy`) that eats whole MQTT
packets of one type (PUBACK) broker -> client while everything else passes (PINGRESP too, so
the connection looks healthy), or accepts TCP and never answers; and from mosquitto's own size
limits (``max_packet_size``, ``message_size_limit``). Every wait polls with a deadline.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.enums import MQTTErrorCode
from prometheus_client import CollectorRegistry

from agent.logs import RATE_LIMIT_S, RateLimitFilter
from agent.metrics import Metrics
from agent.publish.mqtt import MqttConfig, MqttPublisher
from agent.records import Alert, TopChannel
from agent.store.sqlite import Store
from tests.conftest import MosquittoBroker, _require_mosquitto
from tests.integration.mqtt_proxy import PUBACK, MqttProxy
from tests.integration.test_mqtt_publish import (
    DEVICE,
    Subscriber,
    raise_alert,
    sample,
    wait_until,
)

pytestmark = pytest.mark.integration

LOGGER = "test.mqtt_faults"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "agent.db")
    yield s
    s.close()


@pytest.fixture
def cleanup() -> Iterator[list[Callable[[], None]]]:
    todo: list[Callable[[], None]] = []
    yield todo
    for fn in reversed(todo):
        fn()


def publisher(host: str, port: int, store: Store, registry: CollectorRegistry,
              cleanup: list[Callable[[], None]], **kw: Any) -> MqttPublisher:
    config = MqttConfig(enabled=True, host=host, port=port, reconnect_min_s=1.0,
                        reconnect_max_s=1.0, **{"keepalive_s": 1, **kw})
    pub = MqttPublisher(config, store, DEVICE, Metrics(registry),
                        logger=logging.getLogger(LOGGER))
    cleanup.append(pub.stop)
    return pub


def proxy(cleanup: list[Callable[[], None]], upstream: MosquittoBroker | None = None,
          **kw: Any) -> MqttProxy:
    p = MqttProxy((upstream.host, upstream.port) if upstream else ("127.0.0.1", 9), **kw)
    cleanup.append(p.close)
    return p


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and text in r.getMessage()]


def big_alert(store: Store, pub: MqttPublisher, channels: int, model: str = "ae") -> Alert:
    """An alert whose payload grows with ``channels`` top channels (and a long ``model``)."""
    seq = store.next_alert_seq("pump1")
    alert = Alert(
        alert_id=f"{DEVICE}:pump1:{seq}", device_id=DEVICE, stream="pump1", seq=seq,
        model_name=model, model_version=2, score=3.0, threshold=1.5,
        window_start=1_700_000_000.0, window_end=1_700_000_001.0, raised_at=1_700_000_001.2,
        top_channels=tuple(TopChannel(f"channel-with-a-long-name-{i:03d}", 1.0 / channels)
                           for i in range(channels)),
    )
    store.add_alert(alert)
    pub.notify(alert.alert_id, time.monotonic())
    return alert


# -- item: no progress guard ---------------------------------------------------------------------


def test_a_dead_paho_network_thread_is_replaced_by_a_new_client(
    mosquitto: MosquittoBroker, store: Store, cleanup: list[Callable[[], None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """paho's network thread ends on an exception it does not handle (paho 2.1 did on a PUBACK
    reason code it cannot decode) and leaves the socket open behind it: nothing is read,
    nothing reconnects, and dropping the socket fails (ENOTCONN once the broker closed it). The
    progress guard then starts a new client, and the alerts in the outbox are delivered."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    sub = Subscriber(mosquitto, [f"edge/{DEVICE}/alerts"])
    cleanup.append(sub.close)
    pub = publisher(mosquitto.host, mosquitto.port, store, CollectorRegistry(), cleanup,
                    progress_timeout_s=3.0)
    pub.start()
    wait_until(lambda: pub.connected, 10, "the connection")
    first = raise_alert(store, pub)
    wait_until(lambda: first.alert_id in sub.alert_ids(), 10, "the first alert")
    dying = pub._client

    def crash() -> MQTTErrorCode:
        raise RuntimeError("a packet paho cannot handle")

    dying._packet_handle = crash  # type: ignore[method-assign]
    rest = [raise_alert(store, pub) for _ in range(3)]
    wait_until(lambda: dying._thread is None or not dying._thread.is_alive(), 10,
               "paho's network thread to end")
    # the broker has them (paho wrote them before it died) but no PUBACK is ever read
    wait_until(lambda: store.outbox_stats()[0] == 0, 30, "the outbox to empty")
    assert {a.alert_id for a in rest} <= set(sub.alert_ids())
    assert pub._client is not dying
    assert messages(caplog, "starting a new MQTT client")


def test_lost_pubacks_on_a_live_link_rebuild_the_connection(
    mosquitto: MosquittoBroker, store: Store, cleanup: list[Callable[[], None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PUBACKs lost on a link that still answers PINGs: nothing was delivered, mqtt_connected
    stayed 1 and nothing was logged until a TCP reset. Now the publisher drops the connection
    after 3 keepalives without a PUBACK, says so, and the new connection delivers."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    sub = Subscriber(mosquitto, [f"edge/{DEVICE}/alerts"])
    cleanup.append(sub.close)
    p = proxy(cleanup, mosquitto, drop_types=frozenset({PUBACK}), drop_connections=1)
    registry = CollectorRegistry()
    pub = publisher(p.host, p.port, store, registry, cleanup)
    pub.start()
    wait_until(lambda: pub.connected, 10, "the first connection")
    ids = [raise_alert(store, pub).alert_id for _ in range(3)]
    wait_until(lambda: set(ids) <= set(sub.alert_ids()), 10, "the broker to have the alerts")
    wait_until(lambda: p.dropped.get(PUBACK, 0) >= 3, 10, "the proxy to eat the PUBACKs")
    wait_until(lambda: store.outbox_stats()[0] == 0, 30, "the outbox to empty")
    assert sample(registry, "edge_agent_mqtt_stalls_total") >= 1
    assert p.connections >= 2
    assert messages(caplog, "acknowledged none of 3 alert(s) in flight")


def test_every_stall_and_reconnect_is_logged_within_the_rate_limit(
    mosquitto: MosquittoBroker, store: Store, cleanup: list[Callable[[], None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three connection rebuilds within the 30 s log limit: the agent's log showed one "lost"
    and one "reachable again" line for three outages (the disconnects metric said 3). A lost
    and a recovered broker are state changes: every one passes the rate limit."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    p = proxy(cleanup, mosquitto, drop_types=frozenset({PUBACK}), drop_connections=3)
    registry = CollectorRegistry()
    pub = publisher(p.host, p.port, store, registry, cleanup)
    pub.start()
    wait_until(lambda: pub.connected, 10, "the first connection")
    raise_alert(store, pub)
    wait_until(lambda: store.outbox_stats()[0] == 0, 60, "the outbox to empty")
    assert sample(registry, "edge_agent_mqtt_disconnects_total") == 3
    limit = RateLimitFilter(RATE_LIMIT_S)
    passed = [r.getMessage() for r in caplog.records if r.name == LOGGER and limit.filter(r)]
    assert sum("lost the MQTT broker" in m for m in passed) == 3
    assert sum("reachable again" in m for m in passed) == 3
    assert sum("acknowledged none of 1 alert(s)" in m for m in passed) == 3


# -- item: no CONNACK, duplicates after a reconnect ----------------------------------------------


def test_broker_that_never_sends_connack_is_logged_once(
    store: Store, cleanup: list[Callable[[], None]], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    p = proxy(cleanup, silent=True)
    pub = publisher(p.host, p.port, store, CollectorRegistry(), cleanup)
    pub.start()
    wait_until(lambda: p.connections >= 3, 30, "three connection attempts")
    assert not pub.connected
    assert len(messages(caplog, "sent no CONNACK")) == 1


def test_in_flight_alerts_are_sent_once_on_the_new_connection(
    mosquitto: MosquittoBroker, store: Store, cleanup: list[Callable[[], None]],
) -> None:
    """After a reconnect paho re-sends the alerts it holds unacknowledged and the drain sent
    them again: three copies in all. Now two: the first and paho's re-send (DUP)."""
    sub = Subscriber(mosquitto, [f"edge/{DEVICE}/alerts"])
    cleanup.append(sub.close)
    p = proxy(cleanup, mosquitto, drop_types=frozenset({PUBACK}), drop_connections=1)
    pub = publisher(p.host, p.port, store, CollectorRegistry(), cleanup,
                    progress_timeout_s=600.0)
    pub.start()
    wait_until(lambda: pub.connected, 10, "the first connection")
    ids = [raise_alert(store, pub).alert_id for _ in range(3)]
    wait_until(lambda: set(ids) <= set(sub.alert_ids()), 10, "the broker to have the alerts")
    p.cut()
    wait_until(lambda: store.outbox_stats()[0] == 0, 30, "the outbox to empty")
    raise_alert(store, pub)  # a marker: every copy of the first three came before it
    wait_until(lambda: len(set(sub.alert_ids())) == 4, 10, "the marker")
    copies = collections.Counter(sub.alert_ids())
    assert [copies[i] for i in ids] == [2, 2, 2]


# -- item: oversized alerts ----------------------------------------------------------------------


@pytest.fixture
def limited_broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MosquittoBroker]:
    broker = MosquittoBroker(_require_mosquitto(), tmp_path / "limited",
                             extra=tuple(request.param))
    broker.start()
    yield broker
    broker.kill()


@pytest.mark.parametrize("limited_broker", [["max_packet_size 1024"]], indirect=True)
def test_alert_over_the_brokers_packet_size_goes_reduced_or_dead_letter(
    limited_broker: MosquittoBroker, store: Store, cleanup: list[Callable[[], None]],
) -> None:
    """A broker whose Maximum Packet Size is below one alert's size: 99 reconnects in 100 s
    and the rest blocked behind it. With MQTT 5 the publisher reads the limit from the
    CONNACK: a large alert goes reduced, one too large even reduced is dead-lettered, the
    others are delivered, and the connection stays up."""
    sub = Subscriber(limited_broker, [f"edge/{DEVICE}/alerts"])
    cleanup.append(sub.close)
    registry = CollectorRegistry()
    pub = publisher(limited_broker.host, limited_broker.port, store, registry, cleanup,
                    keepalive_s=5)
    pub.start()
    wait_until(lambda: pub.connected, 10, "the connection")
    before = raise_alert(store, pub)
    big = big_alert(store, pub, channels=40)
    huge = big_alert(store, pub, channels=2, model="m" * 1200)
    after = raise_alert(store, pub)
    wait_until(lambda: store.outbox_stats()[0] == 0, 20, "the outbox to empty")
    # the PUBACK reaches the publisher before the broker's copy reaches the subscriber
    expected = {before.alert_id, big.alert_id, after.alert_id}
    wait_until(lambda: expected <= set(sub.alert_ids()), 10, "the subscriber's copies")
    got = {a["alert_id"]: a for a in sub.alerts()}
    assert set(got) == expected
    assert got[big.alert_id]["reduced"] is True and got[big.alert_id]["top_channels"] == []
    assert "reduced" not in got[after.alert_id]
    dead = store.dead_letters()
    assert [(d["kind"], d["record_id"]) for d in dead] == [("mqtt", huge.alert_id)]
    assert "Maximum Packet Size (1024)" in dead[0]["reason"]
    assert sample(registry, "edge_agent_mqtt_disconnects_total") == 0
    assert sample(registry, "edge_agent_mqtt_oversize_total", {"action": "reduced"}) == 1
    assert sample(registry, "edge_agent_mqtt_oversize_total", {"action": "dead_letter"}) == 1
    stored = {a["alert_id"]: a for a in store.alerts()}
    assert stored[huge.alert_id]["published_at"] is not None  # out of the outbox, still uploadable
    assert stored[huge.alert_id]["uploaded_at"] is None


@pytest.mark.parametrize("limited_broker", [["message_size_limit 1024"]], indirect=True)
def test_mqtt311_message_size_limit_needs_the_configured_maximum(
    limited_broker: MosquittoBroker, store: Store, cleanup: list[Callable[[], None]],
) -> None:
    """A 3.1.1 broker with message_size_limit acknowledges an oversized alert and drops it
    (the agent marked 55 such alerts published). With mqtt.max_message_bytes set to the
    broker's limit, the alert goes reduced and arrives."""
    sub = Subscriber(limited_broker, [f"edge/{DEVICE}/alerts"])
    cleanup.append(sub.close)
    pub = publisher(limited_broker.host, limited_broker.port, store, CollectorRegistry(),
                    cleanup, keepalive_s=5, protocol="3.1.1", max_message_bytes=1024)
    pub.start()
    big = big_alert(store, pub, channels=40)
    assert len(json.dumps(big.to_payload())) > 1024
    wait_until(lambda: store.outbox_stats()[0] == 0, 20, "the outbox to empty")
    wait_until(lambda: big.alert_id in sub.alert_ids(), 10, "the reduced alert")
    assert sub.alerts()[0]["reduced"] is True


def test_alerts_the_broker_refuses_stay_in_the_outbox_logged_once(
    tmp_path: Path, store: Store, cleanup: list[Callable[[], None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ACL that denies the alerts topic: a 3.1.1 broker acknowledges and drops each alert
    (the agent marked them published). With MQTT 5 the PUBACK says Not authorized: the alerts
    stay in the outbox for a later connection, one ERROR line, counted."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    acl = tmp_path / "acl"
    acl.write_text("topic read #\ntopic write edge/+/availability\n")
    broker = MosquittoBroker(_require_mosquitto(), tmp_path / "acl-broker",
                             extra=(f"acl_file {acl}",))
    broker.start()
    cleanup.append(broker.kill)
    registry = CollectorRegistry()
    pub = publisher(broker.host, broker.port, store, registry, cleanup, keepalive_s=5)
    pub.start()
    for _ in range(3):
        raise_alert(store, pub)
    label = {"reason": "Not authorized"}
    wait_until(lambda: sample(registry, "edge_agent_mqtt_rejected_total", label) == 3, 10,
               "three rejections")
    assert store.outbox_stats()[0] == 3
    assert sample(registry, "edge_agent_mqtt_published_total") == 0
    assert store.dead_letters() == []
    assert len(messages(caplog, "broker rejected alert")) == 1


def test_refused_alerts_go_out_once_the_broker_takes_them_on_the_same_connection(
    tmp_path: Path, store: Store, cleanup: list[Callable[[], None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ACL denies the alerts topic, then the operator fixes it (mosquitto reloads its ACL
    on SIGHUP) while the agent stays connected: the refused alerts are sent again after the
    retry interval, without waiting for a reconnect that a healthy link never brings."""
    import signal  # noqa: PLC0415

    from agent.publish import drain  # noqa: PLC0415

    monkeypatch.setattr(drain, "REFUSED_RETRY_S", 1.0)
    acl = tmp_path / "acl"
    acl.write_text("topic read #\ntopic write edge/+/availability\n")
    broker = MosquittoBroker(_require_mosquitto(), tmp_path / "acl-broker",
                             extra=(f"acl_file {acl}",))
    broker.start()
    cleanup.append(broker.kill)
    sub = Subscriber(broker, [f"edge/{DEVICE}/alerts"])
    cleanup.append(sub.close)
    registry = CollectorRegistry()
    pub = publisher(broker.host, broker.port, store, registry, cleanup, keepalive_s=5)
    pub.start()
    for _ in range(3):
        raise_alert(store, pub)
    label = {"reason": "Not authorized"}
    wait_until(lambda: sample(registry, "edge_agent_mqtt_rejected_total", label) >= 3, 10,
               "three rejections")
    acl.write_text("topic read #\ntopic write edge/#\n")
    assert broker._proc is not None
    broker._proc.send_signal(signal.SIGHUP)
    wait_until(lambda: store.outbox_stats()[0] == 0, 20, "the refused alerts delivered")
    wait_until(lambda: len({a["alert_id"] for a in sub.alerts()}) == 3, 10,
               "three alerts at the subscriber")
    assert sample(registry, "edge_agent_mqtt_disconnects_total") == 0  # the same connection


@pytest.mark.parametrize(
    ("limited_broker", "protocol"),
    [(["max_packet_size 1024"], "3.1.1"), (["message_size_limit 1024"], "5")],
    indirect=["limited_broker"],
    ids=["3.1.1-max_packet_size", "5-message_size_limit"],
)
def test_a_limit_the_broker_does_not_announce_is_learned_and_blocks_nothing(
    limited_broker: MosquittoBroker, protocol: str, store: Store,
    cleanup: list[Callable[[], None]], caplog: pytest.LogCaptureFixture,
) -> None:
    """No max_message_bytes, and a limit the broker does not announce (3.1.1; or 5 with
    message_size_limit, whose PUBACK paho cannot decode): the broker dropped the connection at
    every attempt to send the large alert and paho re-sent it at every reconnect, so nothing
    behind it was delivered (99 reconnects in 100 s). Now the alert that is first in flight at
    3 short connections in a row is taken for too large: the limit is learned, a new client
    forgets paho's copy, the alert goes reduced and the rest follows."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    sub = Subscriber(limited_broker, [f"edge/{DEVICE}/alerts"])
    cleanup.append(sub.close)
    registry = CollectorRegistry()
    pub = publisher(limited_broker.host, limited_broker.port, store, registry, cleanup,
                    keepalive_s=5, protocol=protocol)
    pub.start()
    wait_until(lambda: pub.connected, 10, "the connection")
    before = raise_alert(store, pub)
    wait_until(lambda: store.outbox_stats()[0] == 0, 10, "the first alert")
    big = big_alert(store, pub, channels=40)
    after = [raise_alert(store, pub) for _ in range(3)]
    wait_until(lambda: store.outbox_stats()[0] == 0, 60, "the outbox to empty")
    wait_until(lambda: {a.alert_id for a in after} <= set(sub.alert_ids()), 10, "the rest")
    got = {a["alert_id"]: a for a in sub.alerts()}
    assert set(got) == {before.alert_id, big.alert_id, *(a.alert_id for a in after)}
    assert got[big.alert_id]["reduced"] is True
    assert sample(registry, "edge_agent_mqtt_disconnects_total") <= 4
    assert len(messages(caplog, "dropped the connection 3 times in a row")) == 1
    assert pub.limit.learned_max_packet is not None
