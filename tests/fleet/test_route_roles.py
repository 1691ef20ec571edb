"""Every route of the fleet app has a known minimum role, checked against every kind of caller.

``ROUTES`` is the table route x role. The test walks the app's routes (``app.routes``, with
the routers FastAPI includes flattened), so a route added without a row here fails, and calls each
one as: nobody, a device, a viewer, an operator and an admin (personal API tokens), and the
bootstrap admin token. A caller below the route's role must get 401 (no credentials) or 403;
a caller at or above it must get anything else (the request then fails later, on its body or
an unknown id, or succeeds harmlessly).
"""

from __future__ import annotations

from collections.abc import Iterator

import fastapi.routing
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.fleet.accounts_util import user_token
from tests.fleet.conftest import ADMIN_TOKEN, enroll

#: (method, path) -> minimum: public | device | viewer | operator | admin | session, or
#: "viewer|device" (an operator of any role, or the device the record belongs to).
ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/openapi.json"): "public",
    ("GET", "/healthz"): "public",
    ("GET", "/metrics"): "public",
    ("GET", "/docs"): "public",
    ("GET", "/docs/assets/{name}"): "public",
    ("GET", "/"): "public",
    ("GET", "/console"): "public",
    ("GET", "/console/"): "public",
    ("GET", "/console/{asset}"): "public",
    ("GET", "/favicon.ico"): "public",
    ("POST", "/v1/session"): "public",
    ("GET", "/v1/session"): "viewer",
    ("DELETE", "/v1/session"): "session",
    ("POST", "/v1/ingest"): "device",
    ("POST", "/v1/samples"): "device",
    ("GET", "/v1/models/assignment"): "device",
    ("POST", "/v1/models/status"): "device",
    ("POST", "/v1/devices/self/health"): "device",
    ("PUT", "/v1/devices/{device_id}/alerts/{alert_id}/{kind}"): "device",
    ("GET", "/v1/devices/{device_id}/alerts/{alert_id}/{kind}"): "viewer|device",
    ("GET", "/v1/devices"): "viewer",
    ("GET", "/v1/devices/{device_id}/aggregates"): "viewer|device",
    ("GET", "/v1/devices/{device_id}/alerts"): "viewer|device",
    ("GET", "/v1/devices/{device_id}/streams"): "viewer",
    ("GET", "/v1/devices/{device_id}/series"): "viewer",
    ("GET", "/v1/devices/{device_id}/models"): "viewer",
    ("GET", "/v1/models"): "viewer",
    ("GET", "/v1/models/running"): "viewer",
    # a device only for a package assigned to it (none is here: refused)
    ("GET", "/v1/models/{name}/{version}/package"): "viewer",
    ("GET", "/v1/rollouts"): "viewer",
    ("GET", "/v1/rollouts/{rollout_id}"): "viewer",
    ("GET", "/v1/alerts"): "viewer",
    ("GET", "/v1/audit"): "viewer",
    ("POST", "/v1/devices"): "operator",
    ("DELETE", "/v1/devices/{device_id}"): "operator",
    ("PATCH", "/v1/devices/{device_id}/tags"): "operator",
    ("POST", "/v1/models"): "operator",
    ("POST", "/v1/rollouts"): "operator",
    ("POST", "/v1/rollouts/{rollout_id}/{action}"): "operator",
    ("POST", "/v1/alerts/{alert_id}/ack"): "operator",
    ("GET", "/v1/users"): "admin",
    ("POST", "/v1/users"): "admin",
    ("PATCH", "/v1/users/{username}"): "admin",
    ("GET", "/v1/tokens"): "admin",
    ("POST", "/v1/tokens"): "admin",
    ("DELETE", "/v1/tokens/{token_id}"): "admin",
    ("GET", "/v1/webhooks"): "admin",
    ("POST", "/v1/webhooks"): "admin",
    ("DELETE", "/v1/webhooks/{webhook_id}"): "admin",
    ("GET", "/v1/webhooks/deliveries"): "admin",
    ("POST", "/v1/webhooks/deliveries/{delivery_id}/redeliver"): "admin",
}

#: Path parameters (one fresh database per test: an allowed revoke of gw1 harms no other test).
PARAMS = {"device_id": "gw1", "rollout_id": "1", "action": "abort", "name": "skab-wstat",
          "version": "1", "username": "ghost", "token_id": "999999", "alert_id": "gw1:pump1:1",
          "asset": "app.js", "kind": "snapshot", "webhook_id": "999999",
          "delivery_id": "999999"}
CALLERS = ("nobody", "device", "viewer", "operator", "admin", "bootstrap")
_RANK = {"viewer": 0, "operator": 1, "admin": 2, "bootstrap": 2}


def app_routes(app: FastAPI) -> Iterator[tuple[str, str]]:
    """Every (method, path) the app serves, HEAD aside."""
    walk = getattr(fastapi.routing, "iter_route_contexts", None)
    routes = walk(app.routes) if walk is not None else app.routes
    for route in routes:
        path = getattr(route, "path", None) or getattr(route, "path_format", None)
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD" and path is not None:
                yield method, path


def allowed(minimum: str, caller: str) -> bool:
    if minimum == "public":
        return True
    if caller == "nobody":
        return False
    if minimum == "device":
        return caller == "device"
    if minimum == "session":
        return False  # no token logs out: only a console session (tests/fleet/test_accounts.py)
    if caller == "device":
        return minimum == "viewer|device"
    return _RANK[caller] >= _RANK[minimum.split("|", maxsplit=1)[0]]


def test_every_route_is_in_the_table(client: TestClient) -> None:
    served = set(app_routes(client.app))  # type: ignore[arg-type]
    assert served == set(ROUTES), (
        f"routes without a role: {sorted(served - set(ROUTES))}; "
        f"rows without a route: {sorted(set(ROUTES) - served)}"
    )


@pytest.mark.parametrize(("method", "path"), sorted(ROUTES), ids=[f"{m} {p}" for m, p in
                                                                  sorted(ROUTES)])
def test_route_refuses_callers_below_its_role(
    client: TestClient, engine: Engine, method: str, path: str
) -> None:
    device = enroll(client, "gw1")
    headers = {
        "nobody": {},
        "device": {"Authorization": f"Bearer {device}"},
        "viewer": user_token(engine, "v1", "viewer"),
        "operator": user_token(engine, "o1", "operator"),
        "admin": user_token(engine, "a1", "admin"),
        "bootstrap": {"Authorization": f"Bearer {ADMIN_TOKEN}"},
    }
    url = path.format(**PARAMS)
    if "series" in path:
        url += "?stream=pump1"
    minimum = ROUTES[(method, path)]
    for caller in CALLERS:
        resp = client.request(method, url, headers=headers[caller])
        if allowed(minimum, caller):
            assert resp.status_code not in (401, 403), (caller, resp.status_code, resp.text)
        else:
            want = 401 if caller == "nobody" else 403
            assert resp.status_code == want, (caller, resp.status_code, resp.text)
