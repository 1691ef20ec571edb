"""The ``disk`` health component follows the free space of the store's file system: a real 2 MiB
tmpfs (root), a real SQLite store, the agent's monitor.

On a full file system the store went red while ``disk`` stayed green (it judged only the disk
budget, and without a budget nothing at all).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.disk_budget import DiskBudget, default_parts
from agent.disk_free import NO_SPACE_RECENT_S, fs_space
from agent.errors import StoreError
from agent.health import GREEN, RED, YELLOW, Component
from agent.metrics import Metrics
from agent.monitor import Monitor
from agent.store.sqlite import Store
from agent.systemd import Notifier
from tests.integration.test_store_pressure import tiny_state
from tests.unit.test_store import make_alert

pytestmark = pytest.mark.integration

__all__ = ["tiny_state"]  # the fixture used here

KIB = 1024


def _fill(path: Path, size: int | None = None) -> None:
    """Append ``size`` bytes to ``path`` (None: until the file system is full)."""
    chunk = b"\0" * (4 * KIB)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        left = size
        with contextlib.suppress(OSError):
            while left is None or left > 0:
                n = os.write(fd, chunk if left is None else chunk[:min(left, len(chunk))])
                if left is not None:
                    left -= n
    finally:
        os.close(fd)


def _by_name(components: tuple[Component, ...]) -> dict[str, Component]:
    return {c.name: c for c in components}


def test_disk_goes_yellow_on_low_space_and_red_with_the_store_on_a_full_file_system(
    tiny_state: Path,
) -> None:
    m = Metrics(CollectorRegistry())
    store = Store(tiny_state / "agent.db", budget_bytes=1024 * KIB, metrics=m)
    later = [0.0]  # seconds added to the disk's clock (to look past the red window)
    disk = DiskBudget(None, store, default_parts(tiny_state), m, check_interval_s=0.0,
                      store_floor_bytes=64 * KIB, monotonic=lambda: time.monotonic() + later[0])
    monitor = Monitor({}, list, lambda: (0, 100), store, m, Notifier(""), disk=disk,
                      watchdog_interval_s=0.0)
    ballast = tiny_state / "ballast"
    try:
        comp = disk.component()
        assert comp.state == GREEN, comp

        space = fs_space(str(tiny_state))
        assert space is not None and space.free > space.low_bytes
        _fill(ballast, space.free - space.low_bytes // 2)  # about half the low mark left
        comp = disk.component()
        assert comp.state == YELLOW, comp
        assert "low space on the file system" in (comp.reason or ""), comp
        assert comp.details["fs_path"] == str(tiny_state)
        free, size = comp.details["fs_free_bytes"], comp.details["fs_size_bytes"]
        assert isinstance(free, int) and isinstance(size, int) and 0 < free < space.low_bytes

        _fill(ballast)  # full
        failed = 0
        for i in range(1, 20_000):
            try:
                store.add_alert(make_alert(i))
            except StoreError:
                failed += 1
                break
        assert failed and store.failure().count > 0
        comps = _by_name(monitor.tick().components)
        assert comps["store"].state == RED, comps["store"]
        assert comps["disk"].state == RED, comps["disk"]
        assert "is full" in (comps["disk"].reason or "") and "disk full" in (
            comps["disk"].reason or ""), comps["disk"]
        assert m.registry.get_sample_value(
            "edge_agent_health_state", {"component": "disk"}) == 2.0

        ballast.unlink()  # the space is back and the store's failure is old
        later[0] = NO_SPACE_RECENT_S + 1.0
        comp = disk.component()
        assert comp.state == GREEN, comp
    finally:
        with contextlib.suppress(OSError):
            ballast.unlink()
        store.close()
