"""Operator accounts on SQLite and PostgreSQL: login sessions and their cookies, CSRF, login
backoff, personal tokens and roles, the bootstrap token, the audit log."""

from __future__ import annotations

import datetime as dt

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from fleet.accounts.sessions import FREE_ATTEMPTS, LoginThrottle, SessionStore
from fleet.accounts.users import UserStore
from fleet.app import create_app
from fleet.errors import TooManyRequests
from fleet.settings import Settings
from tests.fleet.accounts_util import PASSWORD, add_user, login, user_token
from tests.fleet.conftest import ADMIN_TOKEN


def test_login_sets_strict_httponly_cookies_and_logout_ends_the_session(
    client: TestClient, engine: Engine
) -> None:
    add_user(engine, "olga", "operator")
    resp = client.post("/v1/session", json={"username": "olga", "password": PASSWORD})
    assert resp.status_code == 200, resp.text
    assert resp.json()["role"] == "operator"
    cookies = resp.headers.get_list("set-cookie")
    session = next(c for c in cookies if c.startswith("edge_fleet_session="))
    csrf = next(c for c in cookies if c.startswith("edge_fleet_csrf="))
    assert "HttpOnly" in session and "SameSite=strict" in session and "Path=/" in session
    assert "Secure" not in session  # plain HTTP test client: Secure only over TLS
    assert "HttpOnly" not in csrf and resp.json()["csrf_token"] in csrf
    value = session.split(";")[0].split("=", 1)[1]
    assert client.get("/v1/session").json()["username"] == "olga"
    assert client.get("/v1/devices").status_code == 200
    resp = client.delete("/v1/session", headers={"X-CSRF-Token": resp.json()["csrf_token"]})
    assert resp.status_code == 204
    client.cookies.clear()
    client.cookies.set("edge_fleet_session", value)
    assert client.get("/v1/devices").status_code == 401  # the server forgot the session


def test_wrong_password_and_unknown_user_are_the_same_401(
    client: TestClient, engine: Engine
) -> None:
    add_user(engine, "olga", "operator")
    bad = client.post("/v1/session", json={"username": "olga", "password": "nope" * 4})
    unknown = client.post("/v1/session", json={"username": "nobody", "password": "nope" * 4})
    assert bad.status_code == unknown.status_code == 401
    assert bad.json() == unknown.json()
    assert "set-cookie" not in bad.headers


def test_form_login_redirects_to_the_console(client: TestClient, engine: Engine) -> None:
    add_user(engine, "olga", "viewer")
    resp = client.post("/v1/session", content=f"username=olga&password={PASSWORD}",
                       headers={"Content-Type": "application/x-www-form-urlencoded"},
                       follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/console/"
    assert client.get("/v1/session").json()["role"] == "viewer"
    cross = client.post("/v1/session", content=f"username=olga&password={PASSWORD}",
                        headers={"Content-Type": "application/x-www-form-urlencoded",
                                 "Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403


def test_unsafe_session_requests_need_the_csrf_header(client: TestClient, engine: Engine) -> None:
    add_user(engine, "olga", "operator")
    csrf = login(client, "olga")
    body = {"device_id": "gw9", "tags": []}
    assert client.post("/v1/devices", json=body).status_code == 403
    assert client.post("/v1/devices", json=body,
                       headers={"X-CSRF-Token": csrf[:-1] + "x"}).status_code == 403
    resp = client.post("/v1/devices", json=body, headers={"X-CSRF-Token": csrf})
    assert resp.status_code == 201, resp.text
    assert client.get("/v1/devices").status_code == 200  # reads need no CSRF token


def test_login_backoff_refuses_even_the_right_password_then_lets_it_pass(
    client: TestClient, engine: Engine
) -> None:
    add_user(engine, "olga", "operator")
    for _ in range(FREE_ATTEMPTS):
        assert client.post("/v1/session", json={"username": "olga",
                                                "password": "wrong" * 3}).status_code == 401
    resp = client.post("/v1/session", json={"username": "olga", "password": PASSWORD})
    assert resp.status_code == 429
    assert int(resp.headers["Retry-After"]) >= 1
    # the backoff is per user: another user from the same address logs in
    add_user(engine, "ivan", "viewer")
    assert client.post("/v1/session", json={"username": "ivan",
                                            "password": PASSWORD}).status_code == 200


def test_throttle_backoff_grows_and_expires(engine: Engine) -> None:
    now = [dt.datetime(2030, 1, 1, tzinfo=dt.UTC)]
    throttle = LoginThrottle(engine, clock=lambda: now[0])
    for _ in range(FREE_ATTEMPTS):
        throttle.check("olga", "10.0.0.1")
        throttle.failed("olga", "10.0.0.1")
    try:
        throttle.check("olga", "10.0.0.1")
    except TooManyRequests as exc:
        assert exc.retry_after_s == 1
    else:
        raise AssertionError("no backoff after the free attempts")
    throttle.check("olga", "10.0.0.2")  # another address is not slowed down
    now[0] += dt.timedelta(seconds=1.5)
    throttle.check("olga", "10.0.0.1")
    assert throttle.failed("olga", "10.0.0.1") == FREE_ATTEMPTS + 1
    now[0] += dt.timedelta(seconds=1.5)
    try:
        throttle.check("olga", "10.0.0.1")
    except TooManyRequests as exc:
        assert exc.retry_after_s == 1  # 2 s after the 4th failure, 1.5 s passed
    else:
        raise AssertionError("the backoff did not grow")
    throttle.succeeded("olga", "10.0.0.1")
    throttle.check("olga", "10.0.0.1")


def test_sessions_expire_and_die_with_their_user(engine: Engine) -> None:
    UserStore(engine).add("olga", "operator", PASSWORD)
    now = [dt.datetime(2030, 1, 1, tzinfo=dt.UTC)]
    store = SessionStore(engine, ttl_s=60, clock=lambda: now[0])
    value, info = store.create("olga", "127.0.0.1")
    assert store.lookup(value) == info
    now[0] += dt.timedelta(seconds=61)
    assert store.lookup(value) is None
    now[0] -= dt.timedelta(seconds=61)
    UserStore(engine).update("olga", disabled=True)
    assert store.lookup(value) is None


def test_token_roles_are_capped_by_the_user_and_revocable(
    client: TestClient, engine: Engine
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    resp = client.post("/v1/users", json={"username": "olga", "role": "operator"}, headers=admin)
    assert resp.status_code == 201, resp.text
    too_high = client.post("/v1/tokens", json={"username": "olga", "role": "admin"},
                           headers=admin)
    assert too_high.status_code == 422
    resp = client.post("/v1/tokens", json={"username": "olga", "role": "viewer",
                                           "label": "grafana"}, headers=admin)
    assert resp.status_code == 201, resp.text
    token, token_id = resp.json()["token"], resp.json()["id"]
    assert token.startswith("efu_")
    viewer = {"Authorization": f"Bearer {token}"}
    assert client.get("/v1/devices", headers=viewer).status_code == 200
    refused = client.post("/v1/devices", json={"device_id": "gw1"}, headers=viewer)
    assert refused.status_code == 403 and "operator" in refused.json()["detail"]
    listed = client.get("/v1/tokens", headers=admin).json()
    assert [t["label"] for t in listed] == ["grafana"] and listed[0]["token"] is None
    # the user's role drops below a token's: the token acts with the lower role
    op = client.post("/v1/tokens", json={"username": "olga", "role": "operator"},
                     headers=admin).json()["token"]
    op_headers = {"Authorization": f"Bearer {op}"}
    assert client.post("/v1/devices", json={"device_id": "gw1"},
                       headers=op_headers).status_code == 201
    client.patch("/v1/users/olga", json={"role": "viewer"}, headers=admin)
    assert client.post("/v1/devices", json={"device_id": "gw2"},
                       headers=op_headers).status_code == 403
    assert client.delete(f"/v1/tokens/{token_id}", headers=admin).status_code == 204
    assert client.get("/v1/devices", headers=viewer).status_code == 401


def test_disabled_user_loses_tokens_and_sessions(client: TestClient, engine: Engine) -> None:
    headers = user_token(engine, "olga", "operator")
    UserStore(engine).update("olga", password=PASSWORD)
    login(client, "olga")
    assert client.get("/v1/devices").status_code == 200
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    resp = client.patch("/v1/users/olga", json={"disabled": True}, headers=admin)
    assert resp.status_code == 200 and resp.json()["disabled_at"] is not None
    assert client.get("/v1/devices", headers=headers).status_code == 401
    assert client.get("/v1/devices").status_code == 401
    assert client.post("/v1/session", json={"username": "olga",
                                            "password": PASSWORD}).status_code == 401


def test_bootstrap_token_makes_the_first_admin_and_can_be_turned_off(
    settings: Settings, engine: Engine
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with TestClient(create_app(settings, engine)) as tc:
        resp = tc.post("/v1/users", json={"username": "root", "role": "admin",
                                          "password": PASSWORD}, headers=admin)
        assert resp.status_code == 201, resp.text
    off = Settings(db_url=settings.db_url, admin_token="", state_dir=settings.state_dir)
    with TestClient(create_app(off, engine)) as tc:
        assert tc.get("/v1/devices", headers=admin).status_code == 401
        assert tc.get("/v1/devices", headers={"Authorization": "Bearer "}).status_code == 401
        csrf = login(tc, "root")
        resp = tc.post("/v1/users", json={"username": "ivan", "role": "viewer"},
                       headers={"X-CSRF-Token": csrf})
        assert resp.status_code == 201, resp.text


def test_audit_log_records_who_what_target_and_address(
    client: TestClient, engine: Engine
) -> None:
    add_user(engine, "olga", "operator")
    client.post("/v1/session", json={"username": "olga", "password": "wrong" * 3})
    csrf = login(client, "olga")
    client.post("/v1/devices", json={"device_id": "gw1", "tags": ["line=1"]},
                headers={"X-CSRF-Token": csrf})
    client.patch("/v1/devices/gw1/tags", json={"add": ["line=2"]},
                 headers={"X-CSRF-Token": csrf})
    client.delete("/v1/devices/gw1", headers={"X-CSRF-Token": csrf})
    entries = client.get("/v1/audit").json()["entries"]
    got = [(e["actor"], e["via"], e["action"], e["target"]) for e in reversed(entries)]
    assert got == [
        ("olga", "session", "session.login_failed", "olga"),
        ("olga", "session", "session.login", "olga"),
        ("olga", "session", "device.enroll", "gw1"),
        ("olga", "session", "device.tag", "gw1"),
        ("olga", "session", "device.revoke", "gw1"),
    ]
    assert all(e["address"] == "testclient" for e in entries)
    assert entries[1]["detail"] == {"add": ["line=2"], "remove": []}
    older = client.get(f"/v1/audit?before={entries[1]['id']}").json()["entries"]
    assert [e["action"] for e in older] == ["device.enroll", "session.login",
                                            "session.login_failed"]


def test_over_tls_the_cookies_are_secure_and_host_prefixed(
    settings: Settings, engine: Engine
) -> None:
    add_user(engine, "olga", "viewer")
    with TestClient(create_app(settings, engine), base_url="https://fleet.example") as tc:
        resp = tc.post("/v1/session", json={"username": "olga", "password": PASSWORD})
        assert resp.status_code == 200, resp.text
        cookies = resp.headers.get_list("set-cookie")
        session = next(c for c in cookies if c.startswith("__Host-edge_fleet_session="))
        assert "Secure" in session and "HttpOnly" in session and "Path=/" in session
        assert any(c.startswith("__Host-edge_fleet_csrf=") and "Secure" in c for c in cookies)
        assert tc.get("/v1/session").json()["username"] == "olga"
