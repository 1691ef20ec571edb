"""MQTT over TLS with client certificates (mTLS) against a real mosquitto.

The broker gets a TLS listener with ``require_certificate true`` (and a plain loopback listener
for the recording subscriber); the CA, the broker's and the agent's certificates are made by the
test with ``cryptography``. Every failure must be logged with its cause (certificate verify,
host name, missing client certificate), once per cause and not once per retry.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.errors import ConfigError
from agent.metrics import Metrics
from agent.publish.mqtt import MqttConfig, MqttPublisher
from agent.store.sqlite import Store
from tests.conftest import MosquittoBroker, _free_port, _require_mosquitto
from tests.integration.mqtt_subscriber import Subscriber
from tests.integration.test_mqtt_publish import raise_alert, wait_until
from tests.tls_certs import Issued, TestCA

pytestmark = pytest.mark.integration

LOGGER = "test.mqtt_tls"
ALERTS = "edge/gw1/alerts"


class TlsBroker(MosquittoBroker):
    """mosquitto with a plain listener (``port``) and an mTLS one (``tls_port``)."""

    def __init__(self, workdir: Path, ca: TestCA, server: Issued) -> None:
        self.tls_port = _free_port()
        super().__init__(_require_mosquitto(), workdir, extra_config=[
            f"listener {self.tls_port} 127.0.0.1",
            f"cafile {ca.cert_file}",
            f"certfile {server.cert_file}",
            f"keyfile {server.key_file}",
            "require_certificate true",
        ])

    def start(self, timeout_s: float = 5.0) -> None:
        super().start(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection((self.host, self.tls_port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "pki", "plant")


@pytest.fixture
def client_cert(ca: TestCA) -> Issued:
    return ca.issue("edge-gw1", client=True, key_password=b"key-secret")


@pytest.fixture
def key_password_file(tmp_path: Path) -> Path:
    path = tmp_path / "key.password"
    path.write_text("key-secret\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def start_broker(tmp_path: Path, ca: TestCA) -> Iterator[Callable[..., TlsBroker]]:
    made: list[TlsBroker] = []

    def start(hosts: tuple[str, ...] = ("127.0.0.1",)) -> TlsBroker:
        broker = TlsBroker(tmp_path / f"mosquitto{len(made)}", ca, ca.issue("broker", hosts=hosts))
        made.append(broker)
        broker.start()
        return broker

    yield start
    for broker in made:
        broker.kill()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "agent.db")
    yield s
    s.close()


@pytest.fixture
def publishers() -> Iterator[list[MqttPublisher]]:
    made: list[MqttPublisher] = []
    yield made
    for pub in made:
        pub.stop()


def publisher(broker: TlsBroker, store: Store, made: list[MqttPublisher],
              **tls: str) -> MqttPublisher:
    config = MqttConfig(enabled=True, host="127.0.0.1", port=broker.tls_port, tls=True,
                        reconnect_min_s=1.0, reconnect_max_s=1.0, keepalive_s=5,
                        **tls)  # type: ignore[arg-type]
    pub = MqttPublisher(config, store, "gw1", Metrics(CollectorRegistry()),
                        logger=logging.getLogger(LOGGER))
    made.append(pub)
    return pub


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno >= logging.WARNING]


def test_alerts_are_delivered_with_a_client_certificate_and_an_encrypted_key(
    start_broker: Callable[..., TlsBroker], ca: TestCA, client_cert: Issued,
    key_password_file: Path, store: Store, publishers: list[MqttPublisher],
) -> None:
    broker = start_broker()
    sub = Subscriber(broker, [ALERTS])  # on the plain loopback listener
    try:
        pub = publisher(broker, store, publishers, ca_file=str(ca.cert_file),
                        cert_file=str(client_cert.cert_file), key_file=str(client_cert.key_file),
                        key_password_file=str(key_password_file))
        pub.start()
        sent = [raise_alert(store, pub).alert_id for _ in range(3)]
        assert pub.flush(10.0), broker.log_tail()
        wait_until(lambda: sub.alert_ids() == sent, 10, "the 3 alerts at the subscriber")
    finally:
        sub.close()
    assert store.outbox_stats()[0] == 0  # every PUBACK came over the mTLS listener


def wait_for_warning(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    wait_until(lambda: any(text in t for t in warnings(caplog)), 10, f"a warning with {text!r}")
    return warnings(caplog)


def test_a_broker_that_requires_a_certificate_says_so(
    start_broker: Callable[..., TlsBroker], ca: TestCA, store: Store,
    publishers: list[MqttPublisher], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    broker = start_broker()
    pub = publisher(broker, store, publishers, ca_file=str(ca.cert_file))
    pub.start()
    raise_alert(store, pub)
    wait_for_warning(caplog, "requires a client certificate")
    assert not pub.flush(3.0)  # three more attempts (reconnect every second), still refused
    texts = warnings(caplog)
    assert sum("requires a client certificate" in t for t in texts) == 1, texts
    assert store.outbox_stats()[0] == 1  # the alert waits in the outbox


def test_a_broker_signed_by_an_unknown_ca_fails_verification(
    tmp_path: Path, start_broker: Callable[..., TlsBroker], client_cert: Issued,
    key_password_file: Path, store: Store, publishers: list[MqttPublisher],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    broker = start_broker()
    other = TestCA(tmp_path / "other-pki", "other")
    pub = publisher(broker, store, publishers, ca_file=str(other.cert_file),
                    cert_file=str(client_cert.cert_file), key_file=str(client_cert.key_file),
                    key_password_file=str(key_password_file))
    pub.start()
    raise_alert(store, pub)
    wait_for_warning(caplog, "certificate verify failed")
    assert not pub.flush(2.5)  # more attempts, each refused
    texts = warnings(caplog)
    assert sum("certificate verify failed" in t for t in texts) == 1, texts
    assert "mqtt.ca_file" in next(t for t in texts if "verify failed" in t)


def test_a_broker_certificate_for_another_host_is_a_hostname_mismatch(
    start_broker: Callable[..., TlsBroker], ca: TestCA, client_cert: Issued,
    key_password_file: Path, store: Store, publishers: list[MqttPublisher],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    broker = start_broker(hosts=("broker.plant.example",))
    pub = publisher(broker, store, publishers, ca_file=str(ca.cert_file),
                    cert_file=str(client_cert.cert_file), key_file=str(client_cert.key_file),
                    key_password_file=str(key_password_file))
    pub.start()
    texts = wait_for_warning(caplog, "mismatch")
    message = next(t for t in texts if "mismatch" in t)
    assert "certificate verify failed" in message and "mqtt.host" in message


def test_a_wrong_key_password_is_a_config_error(
    tmp_path: Path, ca: TestCA, client_cert: Issued, store: Store,
) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-it\n")
    wrong.chmod(0o600)
    config = MqttConfig(enabled=True, tls=True, ca_file=str(ca.cert_file),
                        cert_file=str(client_cert.cert_file),
                        key_file=str(client_cert.key_file), key_password_file=str(wrong))
    with pytest.raises(ConfigError, match=r"mqtt\.key_file"):
        MqttPublisher(config, store, "gw1", Metrics(CollectorRegistry()))


def test_a_client_key_others_can_write_is_refused(
    ca: TestCA, client_cert: Issued, key_password_file: Path, store: Store,
) -> None:
    client_cert.key_file.chmod(0o660)
    config = MqttConfig(enabled=True, tls=True, ca_file=str(ca.cert_file),
                        cert_file=str(client_cert.cert_file),
                        key_file=str(client_cert.key_file),
                        key_password_file=str(key_password_file))
    with pytest.raises(ConfigError, match="writable by its group"):
        MqttPublisher(config, store, "gw1", Metrics(CollectorRegistry()))
