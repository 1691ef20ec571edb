"""The fast upload encoder (stored rows -> record JSON text -> spliced batch) against pydantic.

The uploader never builds pydantic models for records; these tests prove that what it sends is a
schema-valid :class:`IngestBatch` with exactly the values the model path (``pending_uploads`` ->
``IngestBatch.model_validate``) would send, for random records, and that the next-batch read and
the range update of ``mark_uploaded`` touch exactly the rows they should.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from agent.records import Aggregate, ChannelStats
from agent.store.sqlite import Store, id_runs
from cloud_sync.client import batch_json, columns_batch_json
from cloud_sync.protocol import IngestBatch
from tests.unit.test_store import make_alert

SPECIAL = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300, 1e300, 0.30000000000000004,
           5e-324, 123456789.123456789)


def _float(rng: random.Random) -> float:
    if rng.random() < 0.2:
        return rng.choice(SPECIAL)
    return rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-8, 8)


def _aggregate(rng: random.Random, i: int) -> Aggregate:
    stream = rng.choice(["pump1", "s-2", "a.b_c"])
    channels = tuple(
        ChannelStats(rng.choice(["temp", "vib x", "ünï\"cödé\\", "p"]) + str(c),
                     rng.randint(0, 10**12), _float(rng), _float(rng), _float(rng),
                     abs(_float(rng)))
        for c in range(rng.randint(0, 5))
    )
    return Aggregate(
        device_id="gw1", stream=stream, interval_start=1_600_000_000.0 + 60.0 * i
        + rng.choice([0.0, 0.001, 0.123456789]), interval_s=rng.choice([60.0, 0.5, 86400.0]),
        count=rng.randint(0, 10**9), channels=channels, max_score=_float(rng),
        windows=rng.randint(0, 1000), alert_count=rng.randint(0, 50),
    )


def test_fast_batches_are_valid_and_equal_to_the_model_path(tmp_path: Path) -> None:
    rng = random.Random(7)
    with Store(tmp_path / "a.db") as store:
        for i in range(300):
            store.add_aggregate(_aggregate(rng, i))
        for seq in range(1, 6):
            store.add_alert(make_alert(seq))
        slow = store.pending_uploads(1000)
        fast = store.pending_upload_records(1000)
    assert [(r.kind, r.row_id, r.record_id) for r in fast] == [
        (r.kind, r.row_id, r.record_id) for r in slow
    ]
    header = IngestBatch(device_id="gw1", sent_at=1.5, backlog={"alerts": 0, "aggregates": 0},
                         records=[])
    sent = IngestBatch.model_validate_json(batch_json(header, [r.json for r in fast]))
    expected = IngestBatch.model_validate({
        **header.model_dump(by_alias=True),
        "records": [{"kind": r.kind, "id": r.record_id, "body": r.body} for r in slow],
    })
    assert sent == expected
    assert sent.model_dump_json(by_alias=True) == expected.model_dump_json(by_alias=True)


def test_corrupt_stored_json_costs_one_record_not_the_batch(tmp_path: Path) -> None:
    rng = random.Random(1)
    with Store(tmp_path / "a.db") as store:
        store.add_aggregate(_aggregate(rng, 0))
        store.add_aggregate(_aggregate(rng, 1))
        with store._use("test") as conn:  # a damaged row: not JSON
            conn.execute("UPDATE aggregates SET channels = '[{oops' WHERE id = 1")
        rows = store.pending_upload_records(10)
    header = IngestBatch(device_id="gw1", sent_at=1.5, backlog={"alerts": 0, "aggregates": 0},
                         records=[])
    doc = batch_json(header, [r.json for r in rows])
    import json  # noqa: PLC0415

    parsed = json.loads(doc)  # the batch stays valid JSON
    assert parsed["records"][0]["body"]["channels"] is None  # the fleet rejects this one
    IngestBatch.model_validate({**parsed, "records": parsed["records"][1:]})


def test_next_batch_reads_after_the_in_flight_rows(tmp_path: Path) -> None:
    rng = random.Random(3)
    with Store(tmp_path / "a.db") as store:
        for i in range(10):
            store.add_aggregate(_aggregate(rng, i))
        store.add_alert(make_alert(1))
        first = store.pending_upload_records(4)
        assert [r.kind for r in first] == ["alert"] + ["aggregate"] * 3
        after = (first[0].row_id, first[-1].row_id)
        second = store.pending_upload_records(4, after)
        assert [r.row_id for r in second] == [4, 5, 6, 7]
        assert {r.row_id for r in second}.isdisjoint(r.row_id for r in first[1:])


def test_mark_uploaded_by_runs_touches_only_the_named_rows(tmp_path: Path) -> None:
    rng = random.Random(5)
    assert id_runs([]) == [] and id_runs([3]) == [(3, 3)]
    with Store(tmp_path / "a.db") as store:
        for i in range(20):
            store.add_aggregate(_aggregate(rng, i))
        chosen = [1, 2, 3, 7, 9, 10, 20]
        assert store.mark_uploaded("aggregate", chosen, 5.0) == len(chosen)
        left = {r.row_id for r in store.pending_upload_records(100)}
        assert left == set(range(1, 21)) - set(chosen)
        assert store.mark_uploaded("aggregate", chosen, 6.0) == 0  # already marked


def test_columns_batches_are_valid_and_equal_to_the_model_path(tmp_path: Path) -> None:
    # schema 2: the same records as the model path, the aggregates as columns after the alerts
    rng = random.Random(11)
    with Store(tmp_path / "a.db") as store:
        for i in range(300):
            store.add_aggregate(_aggregate(rng, i))
        for seq in range(1, 6):
            store.add_alert(make_alert(seq))
        slow = store.pending_uploads(1000)
        alerts, columns = store.pending_upload_columns(1000)
        assert columns is not None
        assert [r.row_id for r in alerts] + columns.row_ids == [r.row_id for r in slow]
        only_alerts = store.pending_upload_columns(3)
        assert len(only_alerts[0]) == 3 and only_alerts[1] is None
        tail = store.pending_upload_columns(1000, (5, 290))
        assert tail[0] == [] and tail[1] is not None and tail[1].row_ids == list(range(291, 301))
    header = IngestBatch(schema=2, device_id="gw1", sent_at=1.5,
                         backlog={"alerts": 0, "aggregates": 0}, records=[])
    sent = IngestBatch.model_validate_json(
        columns_batch_json(header, [r.json for r in alerts], columns.json))
    expected = IngestBatch.model_validate({
        **header.model_dump(by_alias=True),
        "records": [{"kind": r.kind, "id": r.record_id, "body": r.body} for r in slow],
    })
    assert sent.all_records() == expected.records


def test_corrupt_stored_json_in_columns_costs_one_record_not_the_batch(tmp_path: Path) -> None:
    rng = random.Random(2)
    with Store(tmp_path / "a.db") as store:
        for i in range(3):
            store.add_aggregate(_aggregate(rng, i))
        with store._use("test") as conn:  # damaged rows: not JSON, a blob that is not UTF-8
            conn.execute("UPDATE aggregates SET channels = '[{oops' WHERE id = 1")
            conn.execute("UPDATE aggregates SET stream = x'ff00' WHERE id = 2")
        _alerts, columns = store.pending_upload_columns(10)
    assert columns is not None
    import json  # noqa: PLC0415

    parsed = json.loads(columns.json)  # still one valid JSON object, every column 3 long
    assert {len(v) for v in parsed.values()} == {3}
    assert parsed["channels"][0] == "[{oops"  # the fleet rejects index 0 ...
    assert isinstance(parsed["streams"][1], str)  # ... and index 1 (stream/id mismatch)
