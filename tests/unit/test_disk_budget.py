"""The one disk budget (agent.disk_budget) with a real SQLite store and a models directory."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.config.schema import AgentConfig, StorageSection, StreamConfig
from agent.disk_budget import DirPart, DiskBudget, default_parts, store_file_bytes
from agent.health import Report
from agent.metrics import Metrics
from agent.sources.simulator import SimulatorConfig
from agent.store.sqlite import Store
from tests.unit.test_store import make_aggregate

KIB = 1024
#: The stores' own budget: 1 MiB keeps their WAL bound and -reserve file small (256 KiB).
STORE_BUDGET = 1024 * KIB


def write(path: Path, size: int, age_s: float = 0.0) -> Path:
    """A file of ``size`` bytes, modified ``age_s`` seconds ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    t = path.stat().st_mtime - age_s
    os.utime(path, (t, t))
    return path


def gauge(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state directory with two model packages (active and previous) and an OpenVINO
    cache of three blobs of different ages."""
    s = tmp_path / "state"
    write(s / "models" / "skab-wstat-3" / "model.onnx", 40 * KIB)
    write(s / "models" / "skab-wstat-2" / "model.onnx", 40 * KIB)
    write(s / "models" / "active.json", 200)
    for i, age in enumerate((300.0, 200.0, 100.0)):  # blob0 is the oldest
        write(s / "openvino-cache" / f"blob{i}.blob", 200 * KIB, age)
    return s


def budget_for(store: Store, state: Path, budget: int | None, m: Metrics,
               **kw: object) -> DiskBudget:
    return DiskBudget(budget, store, default_parts(state), m, check_interval_s=0.0,
                      store_floor_bytes=64 * KIB, **kw)  # type: ignore[arg-type]


def test_without_a_budget_every_part_is_measured_and_nothing_deleted(state: Path) -> None:
    m = Metrics(CollectorRegistry())
    with Store(state / "agent.db", budget_bytes=4 * 1024 * KIB) as store:
        disk = budget_for(store, state, None, m)
        comp = disk.component()
        use = disk.last
        assert use is not None
        assert use.parts["models"] == 80 * KIB + 200
        assert use.parts["openvino_cache"] == 600 * KIB
        assert use.parts["store"] == store_file_bytes(store.path) > 0
        assert comp.state == "green" and comp.details["budget_bytes"] is None
        assert store.budget_bytes == 4 * 1024 * KIB  # the configured store budget
    assert gauge(m, "edge_agent_disk_bytes", part="models") == 80 * KIB + 200
    assert gauge(m, "edge_agent_disk_bytes", part="openvino_cache") == 600 * KIB
    assert gauge(m, "edge_agent_disk_budget_bytes") == 0
    assert len(list((state / "openvino-cache").iterdir())) == 3


def test_over_the_budget_the_openvino_cache_goes_first_oldest_first(state: Path) -> None:
    m = Metrics(CollectorRegistry())
    with Store(state / "agent.db", budget_bytes=STORE_BUDGET) as store:
        disk = budget_for(store, state, None, m)
        total = sum(disk.check().parts.values())
        # 300 KiB over the low-water mark: the two oldest blobs (400 KiB) go, the newest stays
        budget = int((total - 300 * KIB) / 0.9)
        assert budget < total
        disk.budget_bytes = budget
        disk.check()
        assert sorted(p.name for p in (state / "openvino-cache").iterdir()) == ["blob2.blob"]
        assert len(list((state / "models").rglob("*.onnx"))) == 2  # models are never evicted
        assert gauge(m, "edge_agent_disk_evicted_bytes_total", part="openvino_cache") == 400 * KIB
        # the store gets what the other parts leave, not more than its own budget
        assert store.budget_bytes is not None and store.budget_bytes < budget


def test_a_snapshot_part_is_evicted_after_the_cache_and_before_the_store(state: Path) -> None:
    m = Metrics(CollectorRegistry())
    snaps = state / "snapshots"
    for i, age in enumerate((50.0, 40.0, 30.0, 20.0)):
        write(snaps / f"cam-{i}.jpg", 20 * KIB, age)
    with Store(state / "agent.db", budget_bytes=STORE_BUDGET) as store:
        disk = budget_for(store, state, None, m)
        disk.add_part(DirPart("snapshots", snaps, evictable=True))
        total = sum(disk.check().parts.values())
        # 630 KiB over the low-water mark: the whole cache (600) and two snapshots (40)
        disk.budget_bytes = int((total - 630 * KIB) / 0.9)
        disk.check()
        assert not list((state / "openvino-cache").iterdir())
        assert sorted(p.name for p in snaps.iterdir()) == ["cam-2.jpg", "cam-3.jpg"]
        assert gauge(m, "edge_agent_disk_evicted_bytes_total", part="snapshots") == 40 * KIB
        assert gauge(m, "edge_agent_disk_bytes", part="snapshots") == 40 * KIB


def test_the_store_evicts_its_rows_when_its_share_shrinks(tmp_path: Path) -> None:
    m = Metrics(CollectorRegistry())
    state = tmp_path / "state"
    write(state / "models" / "pkg-1" / "model.onnx", 100 * KIB)
    with Store(state / "agent.db", metrics=m, budget_bytes=STORE_BUDGET,
               maintenance_interval_s=3600) as store:
        for i in range(3000):
            store.add_aggregate(make_aggregate(60.0 * i))
        store.checkpoint()
        live = store.size_bytes()
        assert live > 256 * KIB
        disk = budget_for(store, state, live // 2 + 100 * KIB, m)
        disk.check()
        assert store.budget_bytes is not None and store.budget_bytes < live
        assert store.size_bytes() <= store.budget_bytes
        evicted = m.registry.get_sample_value(
            "edge_agent_dropped_total", {"kind": "aggregate", "reason": "budget"})
        assert evicted and 0 < evicted < 3000
        assert len(store.aggregates()) == 3000 - evicted  # the oldest went, the rest is kept
        assert (state / "models" / "pkg-1" / "model.onnx").exists()


def test_parts_that_cannot_be_evicted_over_the_budget_are_red_and_logged_once(
    state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = Metrics(CollectorRegistry())
    with Store(state / "agent.db", budget_bytes=STORE_BUDGET) as store:
        disk = budget_for(store, state, 80 * KIB, m)  # less than the two model packages
        with caplog.at_level(logging.INFO, logger="agent.disk"):
            first = disk.component()
            second = disk.component()
            # the operator removes the previous package: fits again
            (state / "models" / "skab-wstat-2" / "model.onnx").unlink()
            disk.budget_bytes = 4096 * KIB
            third = disk.component()
        assert first.state == second.state == "red"
        assert first.reason is not None and "cannot be evicted" in first.reason
        assert "storage.disk_budget_bytes" in first.reason
        assert not list((state / "openvino-cache").iterdir())  # evicted, to no avail
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1  # once per episode, not per check
        assert third.state in ("green", "yellow")
        assert any("fit in" in r.getMessage() for r in caplog.records
                   if r.levelno == logging.INFO)
        body = Report((third,), 0.0).to_json()["components"]
        assert isinstance(body, dict)
        assert set(body["disk"]) >= {"state", "budget_bytes", "used_bytes", "parts"}
        assert body["disk"]["parts"]["models"] == 40 * KIB + 200


def test_near_the_budget_is_yellow(state: Path) -> None:
    m = Metrics(CollectorRegistry())
    with Store(state / "agent.db", budget_bytes=STORE_BUDGET) as store:
        total = sum(budget_for(store, state, None, m).check().parts.values())
        disk = budget_for(store, state, int(total / 0.95), m)
        comp = disk.component()
        assert comp.state == "yellow" and comp.reason is not None
        assert "% of its" in comp.reason
        assert len(list((state / "openvino-cache").iterdir())) == 3  # under the budget
        assert gauge(m, "edge_agent_disk_budget_bytes") == disk.budget_bytes


def test_the_storage_section_is_strict_with_safe_defaults() -> None:
    cfg = AgentConfig(streams=[StreamConfig(name="s", source=SimulatorConfig())])
    assert cfg.storage.disk_budget_bytes is None and cfg.storage.check_interval_s == 60.0
    assert StorageSection(disk_budget_bytes=2 * 1024**3).disk_budget_bytes == 2 * 1024**3
    with pytest.raises(ValueError, match="greater than or equal"):
        StorageSection(disk_budget_bytes=1024)
    with pytest.raises(ValueError, match="Extra inputs"):
        StorageSection(budget=1)  # type: ignore[call-arg]


AGENT = """
[agent]
device_id = "gw1"
state_dir = "{state}"
console_alerts = false
[storage]
disk_budget_bytes = {budget}
[[streams]]
name = "pump1"
[streams.source]
kind = "simulator"
speed = 0
duration_s = 600
"""


def test_the_agent_reports_its_disk_parts_in_healthz_and_metrics(state: Path) -> None:
    from agent.app import Agent  # noqa: PLC0415 - loads the whole agent
    from agent.config.loader import parse_config  # noqa: PLC0415
    from agent.systemd import Notifier  # noqa: PLC0415

    m = Metrics(CollectorRegistry())
    config = parse_config(AGENT.format(state=state, budget=64 * 1024 * KIB), env={})
    agent = Agent(config, m, console=None, notifier=Notifier(""))
    assert agent.run() == 0  # the finite simulation ends
    disk = agent.monitor.report().to_json()["components"]["disk"]  # type: ignore[index]
    assert disk["budget_bytes"] == 64 * 1024 * KIB
    assert disk["parts"]["models"] == 80 * KIB + 200
    assert disk["parts"]["openvino_cache"] >= 600 * KIB  # + what OpenVINO compiled, if installed
    assert disk["parts"]["store"] > 0
    assert disk["store_budget_bytes"] <= 64 * 1024 * KIB
    assert gauge(m, "edge_agent_disk_budget_bytes") == 64 * 1024 * KIB
    assert gauge(m, "edge_agent_disk_bytes", part="store") == disk["parts"]["store"]
    assert gauge(m, "edge_agent_health_state", component="disk") is not None
