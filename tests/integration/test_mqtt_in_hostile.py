"""MqttInSource against a real mosquitto fed hostile payloads: every bad message is rejected
and counted, the session survives it and keeps reading."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.conftest import MosquittoBroker
from tests.integration.test_mqtt_in import Publisher, Running
from tests.integration.test_serial_pty import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def pub(mosquitto: MosquittoBroker) -> Iterator[Publisher]:
    p = Publisher(mosquitto.port)
    yield p
    p.close()


def test_an_integer_beyond_float_range_is_rejected_not_a_crash_loop(
        mosquitto: MosquittoBroker, pub: Publisher) -> None:
    # a 400-digit JSON integer overflowed float(): the callback raised, the QoS 1 message was
    # never acknowledged and the broker sent it again on every reconnect (the stream stalled)
    run = Running(mosquitto.port, format="json", topics=["plant/pump1/telemetry"],
                  fields={"p": "pressure"})
    try:
        assert wait_for(run.connected, timeout=10)
        pub.send("plant/pump1/telemetry", '{"pressure": ' + "9" * 400 + "}")
        pub.send("plant/pump1/telemetry", json.dumps({"pressure": 2.0}))
        assert wait_for(lambda: run.values() == [[2.0]])
        assert run.rejected("non_finite") == 1
        assert run.sup.outage is None and run.source.connects == 1
    finally:
        run.close()
