"""Ingest answers ``Connection: close`` only while another ingest of the same device is in
progress in the process (:mod:`fleet.api.ingest`: spreading one device's keep-alive connections
over ``--workers N``). No timing: the record store is wrapped so that each of two concurrent
requests waits inside it until the other one is there too (a barrier)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import httpx
from fastapi.testclient import TestClient

from fleet.db.records import RecordStore
from tests.fleet.wire import T0, aggregate, batch, gz, gzip_headers


class _Together:
    """A :class:`RecordStore` whose ``ingest`` returns only when two calls are inside it."""

    def __init__(self, inner: RecordStore) -> None:
        self._inner = inner
        self._barrier = threading.Barrier(2, timeout=60)

    def ingest(self, *args: Any) -> Any:
        self._barrier.wait()
        return self._inner.ingest(*args)


async def _two_at_once(client: TestClient, token: str, devices: tuple[str, str]
                       ) -> list[httpx.Response]:
    services = client.app.state.services  # type: ignore[attr-defined]
    client.app.state.services = dataclasses.replace(  # type: ignore[attr-defined]
        services, records=_Together(services.records))
    transport = httpx.ASGITransport(app=client.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as ac:
        bodies = [gz(batch(d, [aggregate(d, t=T0 + 60 * i)])) for i, d in enumerate(devices)]
        return list(await asyncio.gather(*(
            ac.post("/v1/ingest", content=body, headers=gzip_headers(tok))
            for body, tok in zip(bodies, token.split(" "), strict=True)
        )))


def test_overlapping_ingests_of_one_device_close_one_connection(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    tok = enrolled["gw1"]
    first, second = asyncio.run(_two_at_once(client, f"{tok} {tok}", ("gw1", "gw1")))
    assert first.status_code == second.status_code == 200
    assert [r.json()["results"][0]["status"] for r in (first, second)] == ["accepted"] * 2
    closes = [r.headers.get("connection") for r in (first, second)]
    assert closes.count("close") == 1  # the one answered while the other was in progress


def test_other_devices_and_single_requests_keep_their_connection(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    tokens = f"{enrolled['gw1']} {enrolled['gw2']}"
    services = client.app.state.services  # type: ignore[attr-defined]
    answers = asyncio.run(_two_at_once(client, tokens, ("gw1", "gw2")))
    assert [r.status_code for r in answers] == [200, 200]
    assert [r.headers.get("connection") for r in answers] == [None, None]
    client.app.state.services = services  # type: ignore[attr-defined]
    single = client.post("/v1/ingest", content=gz(batch("gw1", [aggregate("gw1", t=T0 + 999)])),
                         headers=gzip_headers(enrolled["gw1"]))
    assert single.status_code == 200 and "connection" not in single.headers
