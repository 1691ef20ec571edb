"""Fleet fixtures: every ``fleet_db`` test runs on SQLite (a temp file) and PostgreSQL.

PostgreSQL: 127.0.0.1:5432, user ``postgres`` with trust auth, database ``test`` (see .ci/run).
One fresh database ``fleet_test_<random>`` per session, migrated once, emptied before each test,
dropped at the end. Unreachable PostgreSQL skips those tests locally and FAILS them under CI.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from fleet.app import create_app
from fleet.db import migrate
from fleet.db.engine import make_engine
from fleet.settings import Settings

PG_ADMIN_DSN = os.environ.get(
    "FLEET_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
)
ADMIN_TOKEN = "admin-" + "x" * 40


@contextlib.contextmanager
def fresh_pg_database(prefix: str, revision: str | None = "head") -> Iterator[str]:
    """A new PostgreSQL database named ``<prefix>_<random>``, migrated to ``revision`` (None:
    left empty): its SQLAlchemy URL; dropped on exit. Skips the test when PostgreSQL is
    unreachable (fails under CI)."""
    try:
        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL unreachable under CI: {exc}")
        pytest.skip(f"PostgreSQL unreachable: {exc}")
    name = f"{prefix}_{secrets.token_hex(6)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
            if revision is not None:
                engine = make_engine(Settings(db_url=url, admin_token=ADMIN_TOKEN))
                migrate.upgrade(engine, revision)
                engine.dispose()
            yield url
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database for this session."""
    with fresh_pg_database("fleet_test") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'fleet.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    return Settings(db_url=url, admin_token=ADMIN_TOKEN, state_dir=tmp_path, pool_size=4)


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    """A migrated, empty database."""
    eng = make_engine(settings)
    migrate.upgrade(eng)
    if eng.dialect.name == "postgresql":
        with eng.begin() as conn:
            names = conn.execute(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "AND tablename <> 'alembic_version'"
            )).scalars().all()
            conn.execute(text(f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE"))
    yield eng
    eng.dispose()


@pytest.fixture
def client(settings: Settings, engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(settings, engine)) as tc:
        yield tc


@pytest.fixture
def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def enroll(client: TestClient, device_id: str, tags: list[str] | None = None) -> str:
    resp = client.post(
        "/v1/devices",
        json={"device_id": device_id, "tags": tags or []},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert resp.status_code == 201, resp.text
    token = resp.json()["token"]
    assert isinstance(token, str)
    return token


@pytest.fixture
def enrolled(client: TestClient) -> dict[str, str]:
    """Two devices, ``gw1`` and ``gw2``: id -> token."""
    return {d: enroll(client, d) for d in ("gw1", "gw2")}


def wait_healthy(base: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """Poll a started ``edge-fleet serve`` at ``base``/healthz until it answers 200; fail with
    its log if the process ends or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
