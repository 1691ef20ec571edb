"""The source registry builds every kind lazily and refuses mismatches."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import ConfigError
from agent.sources.registry import REGISTRY, build_source, load_class, source_kinds
from agent.sources.replay import ReplayConfig, ReplaySource
from agent.sources.serial import SerialConfig, SerialSource
from agent.sources.simulator import SimulatorConfig, SimulatorSource


def test_every_kind_has_a_loadable_class_whose_module_defines_the_config() -> None:
    assert source_kinds() == ("camera", "modbus", "mqtt", "opcua", "replay", "serial", "simulator")
    for kind, (config_class, _) in REGISTRY.items():
        cls = load_class(kind)
        # the config lives with the source, or beside it (modbus_config: no pymodbus import)
        assert config_class.__module__ in {cls.__module__, cls.__module__ + "_config"}
        assert hasattr(cls, "run")


def test_build_each_kind(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("datetime;x\n2020-03-09 10:14:33;1\n")
    replay = build_source(ReplayConfig(path=str(path)), "r")
    assert isinstance(replay, ReplaySource) and replay.channels == ("x",)
    serial = build_source(SerialConfig(port="loop://", channels=["a"]), "s")
    assert isinstance(serial, SerialSource) and serial.stream == "s"
    sim = build_source(SimulatorConfig(), "m", clock=lambda: 0.0)
    assert isinstance(sim, SimulatorSource) and len(sim.channels) == 8


def test_unknown_kind() -> None:
    with pytest.raises(ConfigError, match="unknown source kind 'lidar'"):
        load_class("lidar")


def test_config_without_kind() -> None:
    with pytest.raises(ConfigError, match="no 'kind'"):
        build_source(object(), "x")  # type: ignore[arg-type]
