"""Builders of wire records and batches for the fleet tests (valid unless told otherwise)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from typing import Any

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def aggregate(device: str, stream: str = "pump1", t: float = T0, **body: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "device_id": device,
        "stream": stream,
        "interval_start": t,
        "interval_s": 60.0,
        "count": 600,
        "channels": [
            {"channel": "vib_x", "count": 600, "min": -1.0, "max": 1.5, "mean": 0.1, "std": 0.3}
        ],
        "max_score": 0.7,
        "windows": 12,
        "alert_count": 0,
    }
    payload.update(body)
    return {"kind": "aggregate", "id": f"{device}:{stream}:{int(t * 1000)}", "body": payload}


def alert(device: str, stream: str = "pump1", seq: int = 1, t: float = T0, **body: Any
          ) -> dict[str, Any]:
    rid = f"{device}:{stream}:{seq}"
    payload: dict[str, Any] = {
        "schema": 1,
        "alert_id": rid,
        "device_id": device,
        "stream": stream,
        "seq": seq,
        "model": {"name": "skab-wstat", "version": 3},
        "score": 4.2,
        "threshold": 3.0,
        "window_start": iso(t),
        "window_end": iso(t + 10),
        "raised_at": iso(t + 10.5),
        "top_channels": [{"channel": "vib_x", "contribution": 0.8}],
    }
    payload.update(body)
    return {"kind": "alert", "id": rid, "body": payload}


def batch(device: str, records: list[Any], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": 1,
        "device_id": device,
        "sent_at": T0 + 100,
        "agent_version": "0.1.0",
        "model": {"name": "skab-wstat", "version": 3},
        "backlog": {"alerts": 2, "aggregates": 7},
        "records": records,
    }
    out.update(extra)
    return out


def gz(doc: Any) -> bytes:
    return gzip.compress(json.dumps(doc).encode())


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def gzip_headers(token: str) -> dict[str, str]:
    return {**bearer(token), "Content-Type": "application/json", "Content-Encoding": "gzip"}


def columns(aggregates: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Schema-2 columns of ``aggregate(...)`` records (channels as compact JSON text)."""
    bodies = [a["body"] for a in aggregates]
    return {
        "ids": [a["id"] for a in aggregates],
        "streams": [b["stream"] for b in bodies],
        "interval_start": [b["interval_start"] for b in bodies],
        "interval_s": [b["interval_s"] for b in bodies],
        "count": [b["count"] for b in bodies],
        "channels": [json.dumps(b["channels"], separators=(",", ":")) for b in bodies],
        "max_score": [b["max_score"] for b in bodies],
        "windows": [b["windows"] for b in bodies],
        "alert_count": [b["alert_count"] for b in bodies],
    }


def batch2(device: str, records: list[Any], aggregates: list[dict[str, Any]] | None,
           **extra: Any) -> dict[str, Any]:
    """A schema-2 batch: ``records``, then ``aggregates`` as columns (None: no columns)."""
    out = batch(device, records, **{"schema": 2, **extra})
    if aggregates is not None:
        out["aggregates"] = columns(aggregates)
    return out
