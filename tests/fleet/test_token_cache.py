"""The per-process cache of device-token authentications and its revocation semantics.

Each "worker" below is its own :class:`DeviceRegistry` with its own :class:`TokenCache` over the
same database, as ``edge-fleet serve --workers N`` runs them. Time is a fake monotonic clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from fleet.app import create_app
from fleet.cli import main
from fleet.db.devices import DeviceRegistry, hash_token
from fleet.db.token_cache import LISTENED_TTL_S, TokenCache
from fleet.settings import Settings
from tests.fleet.conftest import enroll
from tests.fleet.wire import aggregate, batch, bearer

TTL_S = 30.0


class FakeTimer:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def worker(engine: Engine, timer: FakeTimer) -> DeviceRegistry:
    return DeviceRegistry(engine, token_cache=TokenCache(TTL_S, timer=timer))


def test_cache_entries_expire_and_are_dropped_by_device() -> None:
    timer = FakeTimer()
    cache = TokenCache(TTL_S, timer=timer)
    cache.put("d1", "gw1", cache.generation())
    cache.put("d2", "gw2", cache.generation())
    assert (cache.get("d1"), cache.get("d2"), cache.get("d3")) == ("gw1", "gw2", None)
    cache.drop_device("gw1")
    assert (cache.get("d1"), cache.get("d2")) == (None, "gw2")
    timer.now += TTL_S + 0.001
    assert cache.get("d2") is None
    assert len(cache) == 0


def test_a_lookup_that_started_before_a_revoke_is_not_cached() -> None:
    cache = TokenCache(TTL_S, timer=FakeTimer())
    stamp = cache.generation()  # a lookup reads the token as valid ...
    cache.drop_device("gw1")  # ... while a revoke commits and drops the device
    cache.put("d1", "gw1", stamp)
    assert cache.get("d1") is None


@pytest.mark.parametrize("ttl_s, max_entries", [(0.0, 10), (-1.0, 10), (1.0, 0)])
def test_cache_refuses_bad_limits(ttl_s: float, max_entries: int) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        TokenCache(ttl_s, max_entries)


def test_cache_is_keyed_by_the_token_hash_never_the_token(engine: Engine) -> None:
    cache = TokenCache(TTL_S, timer=FakeTimer())
    registry = DeviceRegistry(engine, token_cache=cache)
    token = registry.enroll("gw1", [])
    assert registry.authenticate(token) == "gw1"
    assert cache.get(hash_token(token)) == "gw1"
    assert cache.get(token) is None
    assert registry.authenticate_cached(token) == "gw1"
    assert registry.authenticate_cached("unknown") is None
    assert registry.authenticate("unknown") is None
    assert len(cache) == 1  # failures are not cached


def test_revocation_takes_effect_at_once_here_and_within_the_ttl_elsewhere(
    engine: Engine,
) -> None:
    timer_a, timer_b = FakeTimer(), FakeTimer()
    a, b = worker(engine, timer_a), worker(engine, timer_b)
    token = a.enroll("gw1", [])
    assert a.authenticate(token) == b.authenticate(token) == "gw1"  # both cached it

    a.revoke("gw1")
    assert a.authenticate(token) is None  # the revoking worker refuses at once
    timer_b.now += TTL_S - 1
    assert b.authenticate(token) == "gw1"  # another worker: until its entry expires ...
    timer_b.now += 1.001
    assert b.authenticate(token) is None  # ... then the database says revoked
    assert b.authenticate(token) is None  # and a refusal is never cached

    new_token = a.enroll("gw1", [])  # re-enrolled: the new token works everywhere at once
    assert a.authenticate(new_token) == b.authenticate(new_token) == "gw1"
    assert a.authenticate(token) is None


def test_revoke_through_the_api_refuses_the_cached_token_at_once(
    settings: Settings, engine: Engine, admin: dict[str, str]
) -> None:
    assert settings.auth_cache_ttl_s > 0  # the default: the cache is on
    with TestClient(create_app(settings, engine)) as client:
        token = enroll(client, "gw1")
        body = batch("gw1", [aggregate("gw1")])
        for _ in range(2):  # the second request is served from the cache
            assert client.post("/v1/ingest", json=body, headers=bearer(token)).status_code == 200
        assert client.delete("/v1/devices/gw1", headers=admin).status_code == 204
        refused = client.post("/v1/ingest", json=body, headers=bearer(token))
        assert refused.status_code == 401
        assert refused.json()["error"] == "unauthorized"


def test_entries_live_an_hour_on_postgresql_and_the_setting_on_sqlite(
    settings: Settings, engine: Engine
) -> None:
    cache = create_app(settings, engine).state.token_cache
    assert isinstance(cache, TokenCache)
    if engine.dialect.name == "postgresql":  # the listener drops revoked entries at once
        assert cache.ttl_s == LISTENED_TTL_S >= 3600
    else:  # no listener: the TTL is the other workers' revocation delay
        assert cache.ttl_s == settings.auth_cache_ttl_s == 30.0


def test_ttl_zero_turns_the_cache_off(settings: Settings, engine: Engine) -> None:
    off = Settings(db_url=settings.db_url, admin_token=settings.admin_token, auth_cache_ttl_s=0)
    with TestClient(create_app(off, engine)) as client:
        token = enroll(client, "gw1")
        body = batch("gw1", [aggregate("gw1")])
        assert client.post("/v1/ingest", json=body, headers=bearer(token)).status_code == 200
        DeviceRegistry(engine).revoke("gw1")  # another process (edge-fleet device revoke)
        assert client.post("/v1/ingest", json=body, headers=bearer(token)).status_code == 401


def test_serve_refuses_a_negative_auth_cache_ttl(tmp_path: Path) -> None:
    assert main(["serve", "--state-dir", str(tmp_path), "--auth-cache-ttl", "-1"]) == 78
