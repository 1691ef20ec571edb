"""The console's plot series downsampled in the database (``ConsoleQueries.series``) on SQLite
and PostgreSQL: parts of one interval merge, buckets keep the peak and the sums, the row cap
marks the series truncated only when rows were left out."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert

from fleet.db import console_queries
from fleet.db.console_queries import ConsoleQueries
from fleet.db.schema import aggregates, devices
from tests.fleet.wire import T0

UTC = dt.timezone.utc


def _at(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, tz=UTC)


def _rows() -> list[dict[str, Any]]:
    """30 one-minute intervals from T0; interval 5 in two parts, interval 7 without a score."""
    rows = []
    for i in range(30):
        parts = [(0.2, 3, 0), (0.9, 4, 1)] if i == 5 else [(0.01 * i, 10 + i, i % 2)]
        for k, (score, windows, alert_count) in enumerate(parts):
            rows.append({"id": f"gw1:pump1:{i}:{k}", "device_id": "gw1", "stream": "pump1",
                         "interval_start": _at(T0 + 60 * i), "interval_s": 60.0, "count": 600,
                         "channels": [], "max_score": None if i == 7 else score,
                         "windows": windows, "alert_count": alert_count,
                         "received_at": _at(T0 + 60 * i + 61)})
    return rows


@pytest.fixture
def queries(engine: Engine) -> ConsoleQueries:
    with engine.begin() as conn:
        conn.execute(insert(devices).values(device_id="gw1", tags=[], created_at=_at(T0)))
        conn.execute(insert(aggregates), _rows())
        conn.execute(insert(aggregates).values(  # another stream: never in pump1's series
            id="gw1:fan:0", device_id="gw1", stream="fan", interval_start=_at(T0),
            interval_s=60.0, count=1, channels=[], max_score=99.0, windows=1, alert_count=1,
            received_at=_at(T0)))
    return ConsoleQueries(engine)


def _expected_buckets(bucket_s: float, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    found: dict[int, list[Any]] = {}
    for r in rows:
        b = int((r["interval_start"].timestamp() - T0) // bucket_s)
        acc = found.setdefault(b, [None, 0, 0])
        if r["max_score"] is not None:
            acc[0] = r["max_score"] if acc[0] is None else max(acc[0], r["max_score"])
        acc[1] += r["windows"]
        acc[2] += r["alert_count"]
    return [(T0 + bucket_s * b, *v) for b, v in sorted(found.items())]


def test_one_point_per_interval_with_parts_merged(queries: ConsoleQueries) -> None:
    s = queries.series("gw1", "pump1", _at(T0), _at(T0 + 1800), 30)
    assert s.bucket_s == 0 and not s.truncated and len(s.points) == 30
    assert s.points[5] == (T0 + 300, 0.9, 7, 1)  # the two parts: max score, summed counts
    assert s.points[7] == (T0 + 420, None, 17, 1)  # an interval without a score stays a gap
    assert s.points[29] == (T0 + 1740, 0.29, 39, 1)
    assert queries.series("gw1", "pump1", _at(T0 + 60), _at(T0 + 120), 30).points == [
        (T0 + 60, 0.01, 11, 1)]  # [since, until): the interval at until is outside


def test_buckets_past_max_points_keep_the_peak_and_the_sums(queries: ConsoleQueries) -> None:
    s = queries.series("gw1", "pump1", _at(T0), _at(T0 + 1800), 10)
    assert s.bucket_s == 180 and not s.truncated
    assert s.points == _expected_buckets(180, _rows())
    assert s.points[1] == (T0 + 180, 0.9, 13 + 14 + 3 + 4, 1 + 0 + 0 + 1)  # intervals 3..5


def test_truncated_only_when_rows_were_left_out(
    queries: ConsoleQueries, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console_queries, "SERIES_MAX_ROWS", 31)  # exactly the rows in range
    s = queries.series("gw1", "pump1", _at(T0), _at(T0 + 1800), 10)
    assert not s.truncated and s.points == _expected_buckets(180, _rows())
    monkeypatch.setattr(console_queries, "SERIES_MAX_ROWS", 12)  # the oldest 12 rows
    s = queries.series("gw1", "pump1", _at(T0), _at(T0 + 1800), 10)
    assert s.truncated and s.points == _expected_buckets(180, _rows()[:12])
    assert s.points[-1][0] == T0 + 540  # intervals 0..10: the newest buckets are missing


def test_extent_is_the_streams_data_whatever_the_range(
    queries: ConsoleQueries, engine: Engine
) -> None:
    ext = queries.extent("gw1", "pump1")
    assert (ext.first_at, ext.last_at) == (_at(T0), _at(T0 + 29 * 60))
    assert ext.current_threshold is None  # no alert: no threshold known
    assert queries.extent("gw1", "nothing") == console_queries.Extent(None, None, None)
    seen: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "FROM aggregates" in statement:
            seen.append((statement, params))

    event.listen(engine, "before_cursor_execute", grab)
    try:
        queries.extent("gw1", "pump1")
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    assert len(seen) == 1
    if engine.dialect.name != "postgresql":
        return
    with engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")  # tiny tables: show the index anyway
        plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + seen[0][0], seen[0][1]).scalars())
    # min and max each read one end of the (device, stream, time) index: no scan, no sort
    assert "Index Only Scan" in plan and "Backward" in plan, plan
    assert "Seq Scan" not in plan and not re.search(r"(^|->)\s*Sort\s+\(", plan, re.M), plan
    assert "ix_aggregates_series" in plan or "device_id_stream_interval_start" in plan, plan
