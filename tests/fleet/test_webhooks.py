"""Webhooks received by a real HTTP server (http.server in a thread): signature, a receiver that
is down and recovers, the dead-letter list and redelivery, a hanging receiver, device_offline.
The fleet app is served over real HTTP (its lifespan runs the dispatcher), on both databases."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from sqlalchemy import Engine

from fleet.app import create_app
from fleet.notify import SIGNATURE_HEADER, verify
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN
from tests.fleet.live import Receiver, live, wait_for
from tests.fleet.wire import alert, batch, gzip_headers

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRET = "s3cret-" + "k" * 20


def _fast(settings: Settings, **changes: Any) -> Settings:
    fast: dict[str, Any] = {"webhook_backoff_base_s": 0.2, "webhook_backoff_max_s": 0.5,
                            "webhook_poll_s": 0.1, "webhook_timeout_s": 2.0}
    return dataclasses.replace(settings, **{**fast, **changes})


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def _hook(base: str, url: str, events: list[str]) -> int:
    resp = requests.post(f"{base}/v1/webhooks", json={"url": url, "events": events,
                                                       "secret": SECRET},
                         headers=ADMIN, timeout=10)
    assert resp.status_code == 201, resp.text
    assert "secret" not in resp.json()
    return int(resp.json()["id"])


def _device(base: str, name: str = "gw1") -> str:
    resp = requests.post(f"{base}/v1/devices", json={"device_id": name}, headers=ADMIN,
                         timeout=10)
    assert resp.status_code == 201
    return str(resp.json()["token"])


def _alerts(base: str, token: str, seqs: list[int]) -> None:
    body = gzip.compress(json.dumps(batch("gw1", [alert("gw1", seq=s) for s in seqs])).encode())
    resp = requests.post(f"{base}/v1/ingest", data=body, headers=gzip_headers(token), timeout=10)
    assert resp.status_code == 200, resp.text


def _deliveries(base: str, state: str | None = None) -> list[dict[str, Any]]:
    params = {"state": state} if state else {}
    resp = requests.get(f"{base}/v1/webhooks/deliveries", params=params, headers=ADMIN,
                        timeout=10)
    assert resp.status_code == 200
    return list(resp.json()["deliveries"])


def test_alert_event_is_signed_and_received(settings: Settings, engine: Engine,
                                            receiver: Receiver) -> None:
    with live(create_app(_fast(settings), engine)) as base:
        _hook(base, receiver.url, ["alert"])
        token = _device(base)
        _alerts(base, token, [1, 2])
        _alerts(base, token, [1, 2])  # duplicates: no new event
        wait_for(lambda: receiver.got, "the alert webhook")
        got = receiver.got[0]
        assert verify(SECRET, got.body, got.headers[SIGNATURE_HEADER])
        assert not verify("another-secret-xxxxxxxx", got.body, got.headers[SIGNATURE_HEADER])
        assert got.headers["X-Edge-Event"] == "alert"
        assert got.json["event"] == "alert"
        assert got.json["data"]["device_id"] == "gw1" and got.json["data"]["count"] == 2
        assert [a["id"] for a in got.json["data"]["alerts"]] == ["gw1:pump1:1", "gw1:pump1:2"]
        wait_for(lambda: _deliveries(base, "delivered"), "delivered state")
        assert len(receiver.got) == 1


def test_receiver_down_then_recovers(settings: Settings, engine: Engine,
                                     receiver: Receiver) -> None:
    receiver.stop()  # down: connection refused
    with live(create_app(_fast(settings, webhook_max_attempts=1000), engine)) as base:
        _hook(base, receiver.url, ["alert"])
        _alerts(base, _device(base), [7])
        wait_for(lambda: any(d["attempts"] >= 2 for d in _deliveries(base, "pending")),
                 "failed attempts while the receiver is down")
        pending = _deliveries(base, "pending")[0]
        assert pending["last_error"] and pending["last_status"] is None
        receiver.start()
        wait_for(lambda: receiver.got, "delivery after the receiver recovered")
        wait_for(lambda: _deliveries(base, "delivered"), "delivered state")
        assert receiver.got[0].json["data"]["alerts"][0]["id"] == "gw1:pump1:7"


def test_dead_letter_after_the_cap_then_redeliver(settings: Settings, engine: Engine,
                                                  receiver: Receiver) -> None:
    receiver.status = 500
    with live(create_app(_fast(settings, webhook_max_attempts=3), engine)) as base:
        _hook(base, receiver.url, ["alert"])
        _alerts(base, _device(base), [1])
        dead = wait_for(lambda: _deliveries(base, "dead"), "the dead letter")
        assert dead[0]["attempts"] == 3 and dead[0]["last_status"] == 500
        assert len(receiver.got) == 3  # the same delivery, three times
        assert len({r.headers["X-Edge-Delivery"] for r in receiver.got}) == 1
        metrics = requests.get(f"{base}/metrics", timeout=10).text
        assert 'fleet_webhook_deliveries_total{event="alert",outcome="dead"} 1.0' in metrics
        receiver.status = 200
        resp = requests.post(f"{base}/v1/webhooks/deliveries/{dead[0]['id']}/redeliver",
                             headers=ADMIN, timeout=10)
        assert resp.status_code == 200 and resp.json()["state"] == "pending"
        wait_for(lambda: _deliveries(base, "delivered"), "redelivered")
        assert len(receiver.got) == 4
        again = requests.post(f"{base}/v1/webhooks/deliveries/{dead[0]['id']}999/redeliver",
                              headers=ADMIN, timeout=10)
        assert again.status_code == 404
        # adding and redelivering are operator actions: in the audit log, the URL's host only
        audit = requests.get(f"{base}/v1/audit?limit=20", headers=ADMIN, timeout=10).json()
        got = {e["action"]: e for e in audit["entries"] if e["action"].startswith("webhook.")}
        assert set(got) == {"webhook.add", "webhook.redeliver"}, got
        assert got["webhook.add"]["detail"] == {"host": "127.0.0.1", "events": ["alert"]}
        assert got["webhook.redeliver"]["target"] == str(dead[0]["id"])
        assert got["webhook.redeliver"]["actor"] == "bootstrap"
        assert "/hook" not in json.dumps(audit)
        hook_id = dead[0]["webhook_id"]
        assert requests.delete(f"{base}/v1/webhooks/{hook_id}", headers=ADMIN,
                               timeout=10).status_code == 204
        audit = requests.get(f"{base}/v1/audit?action=webhook.remove", headers=ADMIN,
                             timeout=10).json()
        assert [e["target"] for e in audit["entries"]] == [str(hook_id)]


def test_hanging_receiver_does_not_stall_the_others(settings: Settings, engine: Engine,
                                                    receiver: Receiver) -> None:
    hung = Receiver(hang=True).start()
    try:
        with live(create_app(_fast(settings, webhook_timeout_s=1.0), engine)) as base:
            _hook(base, hung.url, ["alert"])
            _hook(base, receiver.url, ["alert"])
            _alerts(base, _device(base), [1])
            wait_for(lambda: receiver.got, "the healthy receiver's delivery")
            failed = wait_for(lambda: [d for d in _deliveries(base, "pending")
                                       if d["last_error"]], "the hung receiver's deadline")
            # the attempt's total deadline and the socket's read timeout are both 1 s: either
            # one cuts the hung receiver off first
            error = failed[0]["last_error"]
            assert "deadline" in error or "timed out" in error, error
            assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
    finally:
        hung.stop()


def test_device_offline_event(settings: Settings, engine: Engine, receiver: Receiver) -> None:
    cfg = _fast(settings, offline_after_s=1.0, housekeeping_s=0.2)
    with live(create_app(cfg, engine)) as base:
        _hook(base, receiver.url, ["device_offline"])
        token = _device(base)
        health = {"device_id": "gw1", "at": 1.7e9, "status": "green"}
        resp = requests.post(f"{base}/v1/devices/self/health", json=health,
                             headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert resp.status_code == 204
        wait_for(lambda: receiver.got, "the device_offline webhook")
        got = receiver.got[0].json
        assert got["event"] == "device_offline" and got["data"]["device_id"] == "gw1"


def test_webhook_admin_routes(settings: Settings, engine: Engine) -> None:
    with live(create_app(settings, engine)) as base:
        for bad in ({"url": "ftp://x/y", "events": ["alert"], "secret": SECRET},
                    {"url": "http://h/", "events": ["nope"], "secret": SECRET},
                    {"url": "http://h/", "events": ["alert"], "secret": "short"},
                    {"url": "http://user:pw@h/", "events": ["alert"], "secret": SECRET}):
            resp = requests.post(f"{base}/v1/webhooks", json=bad, headers=ADMIN, timeout=10)
            assert resp.status_code == 422, bad
        token = _device(base)
        as_device = requests.get(f"{base}/v1/webhooks", timeout=10,
                                 headers={"Authorization": f"Bearer {token}"})
        assert as_device.status_code == 403
        hook = _hook(base, "http://127.0.0.1:9/x", ["rollout_halted"])
        listed = requests.get(f"{base}/v1/webhooks", headers=ADMIN, timeout=10).json()
        assert [w["id"] for w in listed["webhooks"]] == [hook]
        assert requests.delete(f"{base}/v1/webhooks/{hook}", headers=ADMIN,
                               timeout=10).status_code == 204
        assert requests.delete(f"{base}/v1/webhooks/{hook}", headers=ADMIN,
                               timeout=10).status_code == 404
