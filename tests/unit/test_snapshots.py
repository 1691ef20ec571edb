"""Camera alert snapshots: rendering, the model's patch map, the store (budget order, upload
body) and the worker (agent.services.snapshots)."""

from __future__ import annotations

import doctest
import io
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from pydantic import ValidationError

from agent.inference import patch_map
from agent.inference.image_package import load_image_package
from agent.inference.onnxruntime import OnnxRuntimeBackend
from agent.inference.patch_map import PatchMapModel
from agent.metrics import Metrics
from agent.pipeline.image import ImageSpec, normalise
from agent.publish import snapshots as publish_snapshots
from agent.records import Alert, Frame, SnapshotRef
from agent.services import snapshot_render as render
from agent.services import snapshots as snapshot_worker
from agent.services.snapshot_upload import UNSUPPORTED_WAIT_S, SnapshotUploader
from agent.services.snapshots import SnapshotConfig, SnapshotJob, SnapshotWorker
from agent.store.sqlite import Store
from cloud_sync.errors import FleetRejected, FleetUnavailable
from cloud_sync.protocol import AlertBody
from tests.unit.test_store import make_aggregate, make_alert

Image = pytest.importorskip("PIL.Image")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "models" / "mtd-patchcore"


@pytest.mark.parametrize("module", [render, patch_map, publish_snapshots, snapshot_worker],
                         ids=lambda m: m.__name__)
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def defect_image(seed: int = 0) -> np.ndarray:
    """A 256 x 256 gray tile with a bright square at rows 160-207, cols 32-79."""
    rng = np.random.default_rng(seed)
    img = (100 + rng.normal(0, 3, (256, 256))).clip(0, 255).astype(np.uint8)
    img[160:208, 32:80] = 255
    return img


def test_frame_jpeg_is_bounded_by_max_edge_and_keeps_the_aspect() -> None:
    frame = np.zeros((480, 1280, 3), np.uint8)
    frame[:, :, 2] = 200  # red in BGR
    jpeg = render.frame_jpeg(frame, 320, 80)
    with Image.open(io.BytesIO(jpeg)) as img:
        assert img.format == "JPEG"
        assert img.size == (320, 120)
        r, g, b = img.convert("RGB").getpixel((10, 10))
        assert r > 150 and g < 60 and b < 60  # BGR became RGB
    small = render.frame_jpeg(np.full((100, 50), 7, np.uint8), 320, 80)
    with Image.open(io.BytesIO(small)) as img:
        assert img.size == (50, 100)  # never scaled up


def test_heatmap_png_has_the_scale_in_its_text_chunks_and_a_legend() -> None:
    pm = np.zeros((4, 4), np.float32)
    pm[3, 0] = 40.0
    png = render.heatmap_png(np.full((200, 200), 100, np.uint8), pm, 20.0, 100,
                             {"alert_id": "gw:cam:1"})
    with Image.open(io.BytesIO(png)) as img:
        assert img.format == "PNG"
        assert img.size == (100, 100 + render.LEGEND_PX)
        assert img.text["scale_min"] == "10" and img.text["scale_max"] == "30"
        assert img.text["alert_id"] == "gw:cam:1" and img.text["patch_max"] == "40"
        rgb = img.convert("RGB")
        hot, cold = rgb.getpixel((5, 95)), rgb.getpixel((95, 5))
    assert cold == (100, 100, 100)  # below the scale: the frame as it is
    assert hot != cold and hot[0] > hot[2]  # the hot patch is coloured (warm)


def test_heatmap_refuses_a_map_without_finite_scores() -> None:
    with pytest.raises(ValueError, match="finite"):
        render.heatmap_png(np.zeros((8, 8), np.uint8), np.full((2, 2), np.nan), 1.0, 64)


def test_patch_map_locates_a_defect_and_gives_the_model_score() -> None:
    pytest.importorskip("onnx")
    pkg = load_image_package(PACKAGE)
    inp = pkg.manifest.input
    spec = ImageSpec(inp.height, inp.width, inp.channels, tuple(inp.mean), tuple(inp.std))
    x = normalise(defect_image(), spec)
    score, pm = PatchMapModel(pkg).run(x)
    assert pm.shape == (16, 16) and pm.dtype == np.float32
    row, col = np.unravel_index(int(np.argmax(pm)), pm.shape)
    assert 9 <= row <= 13 and 1 <= col <= 5, (row, col)  # the square: patch rows 10-12, cols 2-4
    assert float(pm.max()) > 1.5 * float(np.median(pm))  # it stands out of the tile
    plain = OnnxRuntimeBackend(PACKAGE / "model.int8.onnx", "int8")
    assert score == pytest.approx(float(np.asarray(plain.run(x)).reshape(-1)[0]), abs=1e-3)


def _big(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_budget_evicts_snapshots_first_and_keeps_alerts_and_aggregates(tmp_path: Path) -> None:
    m = Metrics()
    with Store(tmp_path / "s.db", metrics=m, budget_bytes=2 * 1024 * 1024,
               maintenance_interval_s=3600.0) as store:
        for i in range(1, 41):
            store.add_alert(make_alert(i, stream="cam"))
            store.add_aggregate(make_aggregate(1_700_000_000.0 + 60 * i, stream="cam"))
            store.add_snapshot(f"gw1:cam:{i}", "cam", {"width": 1, "height": 1},
                               _big(60_000, i), _big(20_000, 1000 + i))
        assert store.size_bytes() > store.budget_bytes
        assert store.enforce_budget() > 0
        assert store.size_bytes() <= store.budget_bytes
        assert len(store.alerts(limit=100)) == 40
        assert len(store.aggregates()) == 40
        assert store.snapshot("gw1:cam:1") is None  # oldest snapshots went first
        assert store.snapshot("gw1:cam:40") is not None  # not all of them
    evicted = m.registry.get_sample_value("edge_agent_dropped_total",
                                          {"kind": "snapshot", "reason": "budget"})
    assert evicted is not None and 0 < evicted < 40
    assert not m.registry.get_sample_value("edge_agent_dropped_total",
                                           {"kind": "alert", "reason": "budget"})


def test_upload_body_drops_the_snapshot_key_that_older_fleets_reject(tmp_path: Path) -> None:
    base = make_alert(1, stream="cam")
    alert = Alert(**{f: getattr(base, f) for f in base.__dataclass_fields__ if f != "snapshot"},
                  snapshot=SnapshotRef("gw1:cam:1", "edge/gw1/cam/snapshot"))
    assert alert.to_payload()["snapshot"] == {"id": "gw1:cam:1", "topic": "edge/gw1/cam/snapshot"}
    with Store(tmp_path / "s.db") as store:
        store.add_alert(alert)
        stored = json.loads(store.pending_alerts(10)[0].payload)
        assert stored["snapshot"]["id"] == "gw1:cam:1"  # MQTT consumers get it
        wire = json.loads(store.pending_upload_records(10)[0].json)
        assert "snapshot" not in wire["body"] and wire["body"]["alert_id"] == "gw1:cam:1"
        assert "snapshot" not in store.pending_uploads(10)[0].body


class _FakeMap:
    def __init__(self) -> None:
        self.runs = 0

    def run(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        self.runs += 1
        pm = np.zeros((16, 16), np.float32)
        pm[12, 4] = 60.0
        return 60.0, pm


def test_worker_stores_the_frame_and_heatmap_of_an_alert(tmp_path: Path) -> None:
    pkg = load_image_package(PACKAGE)
    inp = pkg.manifest.input
    spec = ImageSpec(inp.height, inp.width, inp.channels, tuple(inp.mean), tuple(inp.std))
    fake = _FakeMap()
    m = Metrics()
    captured = np.zeros((720, 1280, 3), np.uint8)
    frame = Frame("cam", 1_700_000_000.0, defect_image(), captured=captured)
    alert = make_alert(7, stream="cam")
    with Store(tmp_path / "s.db") as store:
        store.add_alert(alert)
        worker = SnapshotWorker(SnapshotConfig(max_edge=320), store, m,
                                open_patch_map=lambda _pkg, _rt: fake)  # type: ignore[arg-type,return-value]
        hooks: list[int] = []
        worker.on_stored(lambda: hooks.append(1))
        assert worker.process(SnapshotJob(alert, frame, pkg, spec))
        assert not worker.process(SnapshotJob(alert, frame, pkg, spec))  # one per alert
        snap = store.snapshot(alert.alert_id)
    assert snap is not None and fake.runs == 2 and hooks == [1]
    assert snap.meta["width"] == 320 and snap.meta["height"] == 180
    assert snap.meta["heatmap"]["patch_max"] == 60.0
    with Image.open(io.BytesIO(snap.jpeg)) as img:
        assert img.format == "JPEG" and img.size == (320, 180)
    assert snap.heatmap is not None
    with Image.open(io.BytesIO(snap.heatmap)) as img:
        assert img.format == "PNG" and img.size == (320, 180 + render.LEGEND_PX)
    assert m.registry.get_sample_value("edge_agent_snapshots_total", {"stream": "cam"}) == 1


def test_uploaded_alert_body_is_valid_for_a_fleet_that_does_not_know_snapshots(
    tmp_path: Path,
) -> None:
    base = make_alert(1, stream="cam")
    alert = Alert(**{f: getattr(base, f) for f in base.__dataclass_fields__ if f != "snapshot"},
                  snapshot=SnapshotRef("gw1:cam:1", "edge/gw1/cam/snapshot"))
    with pytest.raises(ValidationError):  # what the payload with its snapshot key would get
        AlertBody.model_validate(alert.to_payload())
    with Store(tmp_path / "s.db") as store:
        store.add_alert(alert)
        body = json.loads(store.pending_upload_records(10)[0].json)["body"]
    AlertBody.model_validate(body)  # extra="forbid", as every fleet so far


class _Fleet:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[tuple[str, str, str, int]] = []

    def put_snapshot(self, device_id: str, alert_id: str, kind: str, data: bytes) -> None:
        self.calls.append((device_id, alert_id, kind, len(data)))
        if self.error is not None:
            raise self.error


def _stored(tmp_path: Path) -> Store:
    store = Store(tmp_path / "s.db")
    for seq in (1, 2):
        store.add_alert(make_alert(seq, stream="cam"))
        store.add_snapshot(f"gw1:cam:{seq}", "cam", {}, b"jpeg", b"png" if seq == 1 else None)
    row_ids = [a["id"] for a in store.alerts()]
    store.mark_uploaded("alert", row_ids[:1], 1.0)  # only alert 1 acknowledged by ingest
    return store


def test_uploader_sends_snapshots_of_acknowledged_alerts_only(tmp_path: Path) -> None:
    m = Metrics()
    fleet = _Fleet()
    with _stored(tmp_path) as store:
        up = SnapshotUploader(store, fleet, "gw1", m, poll_s=0.5)
        assert up.run_once() == 0.5
        assert fleet.calls == [("gw1", "gw1:cam:1", "snapshot", 4), ("gw1", "gw1:cam:1",
                                                                     "heatmap", 3)]
        assert store.snapshot_states(["gw1:cam:1", "gw1:cam:2"]) == {
            "gw1:cam:1": (None, "uploaded"), "gw1:cam:2": (None, None)}
        up.run_once()
        assert len(fleet.calls) == 2  # nothing new until alert 2 is acknowledged
    assert m.registry.get_sample_value("edge_agent_snapshot_uploads_total",
                                       {"status": "uploaded"}) == 1


def test_uploader_keeps_snapshots_an_older_fleet_does_not_take(tmp_path: Path) -> None:
    m = Metrics()
    fleet = _Fleet(FleetRejected(404, "Not Found"))
    with _stored(tmp_path) as store:
        up = SnapshotUploader(store, fleet, "gw1", m, poll_s=0.5)
        assert up.run_once() == UNSUPPORTED_WAIT_S  # an hour before the next try
        assert store.snapshot_states(["gw1:cam:1"])["gw1:cam:1"][1] == "refused: HTTP 404"
        assert store.snapshot("gw1:cam:1") is not None  # kept on the device
        fleet.error = FleetUnavailable("fleet unreachable")
        store.mark_uploaded("alert", [a["id"] for a in store.alerts()], 2.0)
        assert up.run_once() == 0.5  # backoff from the poll interval
        assert store.snapshot_states(["gw1:cam:2"])["gw1:cam:2"][1] is None  # retried later
    assert m.registry.get_sample_value("edge_agent_snapshot_uploads_total",
                                       {"status": "refused"}) == 1
    assert m.registry.get_sample_value("edge_agent_snapshot_uploads_total",
                                       {"status": "failed"}) == 1


def _full_worker(tmp_path: Path, m: Metrics) -> tuple[SnapshotWorker, SnapshotJob, Store]:
    """A worker whose thread is not started, its queue filled to the limit."""
    pkg = load_image_package(PACKAGE)
    inp = pkg.manifest.input
    spec = ImageSpec(inp.height, inp.width, inp.channels, tuple(inp.mean), tuple(inp.std))
    frame = Frame("tiles", 1_700_000_000.0, defect_image())
    store = Store(tmp_path / "s.db")
    worker = SnapshotWorker(SnapshotConfig(), store, m)
    job = SnapshotJob(make_alert(1, stream="tiles"), frame, pkg, spec)
    for _ in range(snapshot_worker.QUEUE_LIMIT):
        assert worker.submit(job)
    return worker, job, store


def _queue_full(m: Metrics) -> float | None:
    return m.registry.get_sample_value(
        "edge_agent_dropped_total", {"kind": "snapshot", "reason": "queue_full"})


def test_finite_replay_reports_skipped_snapshots_once_at_the_end(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    m = Metrics()
    worker, job, store = _full_worker(tmp_path, m)
    finite = SnapshotJob(job.alert, job.frame, job.package, job.spec, finite=True)
    with store, caplog.at_level("INFO", logger="agent.snapshots"):
        assert [worker.submit(finite) for _ in range(3)] == [False] * 3
        assert [r for r in caplog.records if r.name == "agent.snapshots"] == []
        assert _queue_full(m) == 3 and worker.skipped == {"tiles": 3}
        worker.stop(timeout_s=1.0)
    (record,) = [r for r in caplog.records if r.name == "agent.snapshots"]
    assert record.levelname == "INFO"
    message = record.getMessage()
    assert message.startswith("stream tiles: 3 alert snapshot(s) skipped (the recorded input")
    assert "every alert is stored" in message and "reason=\"queue_full\"" in message
    assert worker.skipped == {}


def test_live_stream_warns_with_the_count_and_what_to_do(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    m = Metrics()
    worker, job, store = _full_worker(tmp_path, m)
    with store, caplog.at_level("INFO", logger="agent.snapshots"):
        assert not worker.submit(job)
        assert not worker.submit(job)  # within the minute: counted, not logged again
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1
        message = warnings[0].getMessage()
        assert "stream tiles: 1 alert snapshot(s) skipped so far" in message
        assert "the alerts are kept" in message and "heatmap = false" in message
        assert _queue_full(m) == 2
        worker.stop(timeout_s=1.0)
    (summary,) = [r for r in caplog.records if r.levelname == "INFO"]
    assert "stream tiles: 2 alert snapshot(s) skipped (alerts came faster" in summary.getMessage()


@pytest.mark.parametrize(("source", "finite"), [
    ({"folder": "frames"}, True), ({"folder": "frames", "watch": True}, False),
    ({"url": "rtsp://cam.test/1"}, False)])
def test_service_tells_the_worker_whether_the_stream_ends(
        source: dict[str, object], finite: bool) -> None:
    from types import SimpleNamespace  # noqa: PLC0415

    from agent.services.snapshot_service import SnapshotService  # noqa: PLC0415
    from agent.sources.camera import CameraConfig  # noqa: PLC0415

    jobs: list[SnapshotJob] = []
    worker = SimpleNamespace(submit=lambda job: jobs.append(job) or True, config=SnapshotConfig())
    service = SnapshotService(worker, None, None, None, "gw1")  # type: ignore[arg-type]
    camera = SimpleNamespace(package="pkg", pipeline=SimpleNamespace(
                                 spec="spec", backend=SimpleNamespace(name="openvino")),
                             source=SimpleNamespace(config=CameraConfig.model_validate(
                                 {"kind": "camera", **source})))
    event = SimpleNamespace(frame="frame")
    assert service.submit(make_alert(1, stream="tiles"), event, camera)  # type: ignore[arg-type]
    assert [(job.finite, job.runtime) for job in jobs] == [(finite, "openvino")]
