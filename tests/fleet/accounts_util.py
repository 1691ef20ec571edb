"""Helpers of the account tests: users, personal tokens and console logins."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from fleet.accounts.roles import Role
from fleet.accounts.users import UserStore

PASSWORD = "correct horse battery"


def add_user(engine: Engine, name: str, role: Role, password: str | None = PASSWORD) -> None:
    UserStore(engine).add(name, role, password)


def user_token(engine: Engine, name: str, role: Role) -> dict[str, str]:
    """``Authorization`` header of a new personal token of a new user ``name`` (role ``role``)."""
    store = UserStore(engine)
    store.add(name, role, None)
    _, token = store.create_token(name, role, "test")
    return {"Authorization": f"Bearer {token}"}


def login(client: TestClient, name: str, password: str = PASSWORD) -> str:
    """Log the client in (its cookie jar keeps the session); returns the CSRF token."""
    resp = client.post("/v1/session", json={"username": name, "password": password})
    assert resp.status_code == 200, resp.text
    csrf = resp.json()["csrf_token"]
    assert isinstance(csrf, str) and csrf
    return csrf
