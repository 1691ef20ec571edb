"""The agent's fleet transport over real TLS: ``fleet.ca_file``, ``fleet.pinned_pubkey``.

A real ``edge-fleet serve`` sits behind a TLS-terminating relay on loopback whose certificate is
signed by a CA made in the test (``cryptography``); the agent's own uploader, built from its
config as ``edge-agent run`` builds it, uploads through it. A refused connection (wrong pin,
unknown CA, wrong host name) is shown to carry no byte of a request, so no token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.app import _build_uploader
from agent.config.schema import default_config
from agent.metrics import Metrics
from agent.services.fleet_transport import session_for, warn_plaintext
from agent.services.uploader import FleetConfig
from agent.store.sqlite import Store
from cloud_sync.client import FleetClient
from cloud_sync.errors import FleetUnavailable
from cloud_sync.protocol import IngestBatch
from tests.integration.fleet_peer import FleetProcess
from tests.integration.test_mqtt_publish import wait_until
from tests.integration.tls_relay import TlsRelay
from tests.tls_certs import Issued, TestCA, pin
from tests.unit.test_store import make_alert

pytestmark = pytest.mark.integration


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "pki", "fleet")


@pytest.fixture
def server_cert(ca: TestCA) -> Issued:
    return ca.issue("fleet-server")


@pytest.fixture
def relay(fleet: FleetProcess, server_cert: Issued) -> Iterator[TlsRelay]:
    r = TlsRelay(server_cert.cert_file, server_cert.key_file, fleet.port)
    yield r
    r.close()


def fleet_config(tmp_path: Path, fleet: FleetProcess, url: str, **tls: str | None) -> FleetConfig:
    token = tmp_path / "fleet.token"
    token.write_text(fleet.token + "\n")
    token.chmod(0o600)
    return FleetConfig(enabled=True, url=url, token_file=str(token), **tls)  # type: ignore[arg-type]


def empty_batch() -> IngestBatch:
    return IngestBatch(device_id="gw1", sent_at=time.time(),
                       backlog={"alerts": 0, "aggregates": 0}, records=[])


def test_uploader_delivers_over_https_with_the_ca_file_and_the_pin(
    tmp_path: Path, fleet: FleetProcess, relay: TlsRelay, ca: TestCA, server_cert: Issued
) -> None:
    fc = fleet_config(tmp_path, fleet, relay.url, ca_file=str(ca.cert_file),
                      pinned_pubkey=pin(server_cert.cert))
    base = default_config()
    config = base.model_copy(update={
        "fleet": fc, "agent": base.agent.model_copy(update={"device_id": "gw1"})})
    m = Metrics(CollectorRegistry())
    store = Store(tmp_path / "agent.db", metrics=m)
    for seq in range(1, 6):
        store.add_alert(make_alert(seq))
    up = _build_uploader(config, store, m, time.time)
    up.start()
    try:
        wait_until(lambda: store.upload_backlog() == (0, 0), 30, "the alerts uploaded")
    finally:
        up.stop(5)
        store.close()
    assert fleet.counts("alerts") == (5, 5)
    assert relay.handshakes >= 1


def test_a_second_pin_for_a_key_rotation_is_accepted(
    tmp_path: Path, fleet: FleetProcess, relay: TlsRelay, ca: TestCA, server_cert: Issued
) -> None:
    other = ca.issue("next-server")
    fc = fleet_config(tmp_path, fleet, relay.url, ca_file=str(ca.cert_file),
                      pinned_pubkey=f"{pin(other.cert)}; {pin(server_cert.cert)}")
    result = FleetClient(fc.url or "", fleet.token, session_for(fc)).ingest(empty_batch())
    assert result.results == []


def test_the_configured_ca_file_wins_over_requests_ca_bundle(
    tmp_path: Path, fleet: FleetProcess, relay: TlsRelay, ca: TestCA,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # requests lets these variables replace a session's verify (psf/requests#3829).
    impostor = TestCA(tmp_path / "impostor", "impostor")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(impostor.cert_file))
    monkeypatch.setenv("CURL_CA_BUNDLE", str(impostor.cert_file))
    fc = fleet_config(tmp_path, fleet, relay.url, ca_file=str(ca.cert_file))
    result = FleetClient(fc.url or "", fleet.token, session_for(fc)).ingest(empty_batch())
    assert result.results == []


def test_a_key_that_matches_no_pin_is_refused_before_any_request_byte(
    tmp_path: Path, fleet: FleetProcess, relay: TlsRelay, ca: TestCA, server_cert: Issued
) -> None:
    # The same CA signed both: only the pin tells the fleet's key from an impostor's.
    expected = ca.issue("expected-server")
    fc = fleet_config(tmp_path, fleet, relay.url, ca_file=str(ca.cert_file),
                      pinned_pubkey=pin(expected.cert))
    client = FleetClient(fc.url or "", fleet.token, session_for(fc))
    with pytest.raises(FleetUnavailable) as info:
        client.ingest(empty_batch())
    message = str(info.value)
    assert "PinMismatch" in message
    assert pin(server_cert.cert) in message  # the key it saw, to compare with the config
    assert fleet.token not in message
    # the client ends the connection right after the handshake: on a busy machine the relay
    # may see that before its own side of the handshake returns (then it counts an error)
    wait_until(lambda: relay.handshakes + len(relay.handshake_errors) == 1, 5,
               "the relay saw the one TLS connection")
    assert relay.bytes_to_backend == 0  # the request (and its token) was never sent


def test_a_server_the_ca_did_not_sign_fails_verification(
    tmp_path: Path, fleet: FleetProcess, server_cert: Issued
) -> None:
    impostor_ca = TestCA(tmp_path / "impostor", "impostor")
    impostor = impostor_ca.issue("fleet-server")
    relay = TlsRelay(impostor.cert_file, impostor.key_file, fleet.port)
    try:
        ca_file = tmp_path / "pki" / "fleet-ca.pem"
        fc = fleet_config(tmp_path, fleet, relay.url, ca_file=str(ca_file))
        with pytest.raises(FleetUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            FleetClient(fc.url or "", fleet.token, session_for(fc)).ingest(empty_batch())
        assert relay.bytes_to_backend == 0
    finally:
        relay.close()


def test_a_certificate_for_another_host_fails_verification(
    tmp_path: Path, fleet: FleetProcess, ca: TestCA
) -> None:
    elsewhere = ca.issue("elsewhere", hosts=("fleet.example.com",))
    relay = TlsRelay(elsewhere.cert_file, elsewhere.key_file, fleet.port)
    try:
        fc = fleet_config(tmp_path, fleet, relay.url, ca_file=str(ca.cert_file),
                          pinned_pubkey=pin(elsewhere.cert))
        with pytest.raises(FleetUnavailable, match="mismatch"):
            FleetClient(fc.url or "", fleet.token, session_for(fc)).ingest(empty_batch())
        assert relay.bytes_to_backend == 0
    finally:
        relay.close()


def test_plain_http_to_a_remote_host_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No connection is made: the warning comes when the agent builds its fleet clients.
    fc = FleetConfig(enabled=True, url="http://fleet.plant.example:8700", token_env="TOK")
    with caplog.at_level(logging.WARNING, logger="agent.uploader"):
        for _ in range(3):  # the uploader, the updater and the samples uploader
            session_for(fc).close()
        for url in ("http://127.0.0.1:8700", "http://localhost:8700", "http://[::1]:8700",
                    "https://fleet.plant.example"):
            assert not warn_plaintext(url)
    warnings = [r for r in caplog.records if "plain http" in r.getMessage()]
    assert len(warnings) == 1
    assert "fleet.plant.example" in warnings[0].getMessage()


def test_plain_http_warning_judges_the_host_requests_connects_to() -> None:
    # urllib.parse reads the host after the backslash (127.0.0.1), requests connects to the
    # one before it (10.0.0.5): the warning was silent for a plain-http url to a remote host
    assert warn_plaintext("http://10.0.0.5\\@127.0.0.1:8700")
    assert not warn_plaintext("http://127.0.0.1\\@10.0.0.5:8700")  # goes to 127.0.0.1


@pytest.mark.parametrize(("keys", "problem"), [
    ({"url": "http://127.0.0.1:8700", "ca_file": "/ca.pem"}, "not https"),
    ({"url": "https://f", "pinned_pubkey": "sha1//AAAA"}, "sha256//"),
    ({"url": "https://f", "pinned_pubkey": "sha256//AAAA"}, "32"),
    ({"url": "https://f", "pinned_pubkey": "sha256//not base64!"}, "base64"),
])
def test_tls_keys_are_checked_in_the_config(keys: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        FleetConfig(enabled=True, token_env="TOK", **keys)  # type: ignore[arg-type]
