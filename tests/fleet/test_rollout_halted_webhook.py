"""A halted rollout queues a ``rollout_halted`` webhook event in the halting transaction; a real
http.server receives it (both databases)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from fleet.app import create_app
from fleet.notify import SIGNATURE_HEADER, verify
from fleet.settings import Settings
from tests.fleet.conftest import enroll
from tests.fleet.live import Receiver, wait_for
from tests.fleet.model_pkg import archive, make_keys
from tests.fleet.test_rollouts import GZ, report

SECRET = "rollout-secret-0123456789"


def test_halted_rollout_is_delivered(settings: Settings, engine: Engine, admin: dict[str, str],
                                     tmp_path: Path) -> None:
    key, trusted = make_keys(tmp_path / "keys")
    cfg = dataclasses.replace(settings, trusted_keys_dir=trusted, webhook_poll_s=0.1)
    receiver = Receiver().start()
    try:
        with TestClient(create_app(cfg, engine)) as client:
            assert client.post("/v1/webhooks", headers=admin, json={
                "url": receiver.url, "events": ["rollout_halted"], "secret": SECRET,
            }).status_code == 201
            for v in (1, 2):
                resp = client.post("/v1/models", content=archive(tmp_path, v, key),
                                   headers={**admin, **GZ})
                assert resp.status_code == 201, resp.text
            auth = {"Authorization": f"Bearer {enroll(client, 'gw1', ['line1'])}"}
            ro = client.post("/v1/rollouts", headers=admin, json={
                "name": "skab-wstat", "version": 2, "tag": "line1", "canary_percent": 100,
            }).json()
            assert report(client, auth, "gw1", "rejected", rollout_id=ro["id"],
                          reason="golden mismatch").status_code == 204
            wait_for(lambda: receiver.got, "the rollout_halted webhook")
    finally:
        receiver.stop()
    got = receiver.got[0]
    assert verify(SECRET, got.body, got.headers[SIGNATURE_HEADER])
    assert got.json["event"] == "rollout_halted"
    assert got.json["data"]["rollout_id"] == ro["id"] and got.json["data"]["version"] == 2
    assert "golden mismatch" in got.json["data"]["reason"]
    assert len(receiver.got) == 1
