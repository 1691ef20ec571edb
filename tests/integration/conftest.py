"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.fleet_peer import FleetProcess


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[FleetProcess]:
    """A real ``edge-fleet serve`` on a SQLite file in ``tmp_path/fleet`` (one enrolled device,
    ``fleet.token``), stopped at the end (killed if it does not stop)."""
    proc = FleetProcess(tmp_path / "fleet")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
