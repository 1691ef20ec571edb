"""SimulatorSource: determinism, realistic levels, faults, pacing, exhaustion."""

from __future__ import annotations

import threading
from typing import Literal

import numpy as np
import pytest

from agent.errors import ConfigError, SourceExhausted
from agent.records import Reading
from agent.sources.simulator import FaultConfig, SimulatorConfig, SimulatorSource

FaultKind = Literal["spike", "drift", "noise", "stuck", "offset"]


def simulate(config: SimulatorConfig, clock: float = 1000.0) -> list[Reading]:
    out: list[Reading] = []
    src = SimulatorSource(config, "sim", clock=lambda: clock)
    with pytest.raises(SourceExhausted):
        src.run(out.append, lambda e: None, threading.Event())
    return out


def matrix(readings: list[Reading]) -> np.ndarray:
    return np.array([r.values for r in readings])


def test_same_seed_same_signal_other_seed_differs() -> None:
    a = matrix(simulate(SimulatorConfig(speed=0, duration_s=50, seed=7)))
    b = matrix(simulate(SimulatorConfig(speed=0, duration_s=50, seed=7)))
    c = matrix(simulate(SimulatorConfig(speed=0, duration_s=50, seed=8)))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_duration_timestamps_and_shape() -> None:
    out = simulate(SimulatorConfig(speed=0, duration_s=10, sample_rate_hz=2.0), clock=1000.0)
    assert len(out) == 20
    assert [r.ts for r in out[:3]] == [1000.0, 1000.5, 1001.0]
    assert all(r.values.shape == (8,) and r.values.dtype == np.float64 for r in out)
    assert all(np.isfinite(r.values).all() for r in out)


def test_levels_resemble_skab() -> None:
    src = SimulatorSource(SimulatorConfig(), "sim")
    mean = matrix(simulate(SimulatorConfig(speed=0, duration_s=1200))).mean(axis=0)
    expected = dict(
        zip(
            src.channels,
            [0.21, 0.27, 1.9, 0.25, 80.0, 28.0, 230.0, 32.0],
            strict=True,
        )
    )
    for name, value in zip(src.channels, mean, strict=True):
        assert value == pytest.approx(expected[name], rel=0.1), name


def test_current_has_duty_cycles() -> None:
    current = matrix(simulate(SimulatorConfig(speed=0, duration_s=240)))[:, 2]
    assert current.min() < 0.8
    assert current.max() > 2.3


def test_channels_are_correlated() -> None:
    # Both accelerometers load 0.6 on the common noise factor: noise correlation ~0.36.
    cfg = SimulatorConfig(
        speed=0, duration_s=2000, channels=["Accelerometer1RMS", "Accelerometer2RMS"]
    )
    data = matrix(simulate(cfg))
    assert np.corrcoef(data.T)[0, 1] > 0.2


@pytest.mark.parametrize("kind", ["spike", "drift", "noise", "stuck", "offset"])
def test_fault_changes_only_the_hit_channel_in_its_interval(kind: FaultKind) -> None:
    base_cfg = SimulatorConfig(speed=0, duration_s=60, seed=3)
    fault = FaultConfig(kind=kind, channel="Pressure", start_s=20, duration_s=20, magnitude=6.0)
    base = matrix(simulate(base_cfg))
    hit = matrix(simulate(base_cfg.model_copy(update={"faults": [fault]})))
    p = 3  # Pressure
    diff = hit - base
    others = np.delete(diff, p, axis=1)
    assert np.array_equal(others, np.zeros_like(others))
    assert np.all(diff[:20, p] == 0) and np.all(diff[40:, p] == 0)
    assert np.abs(diff[20:40, p]).max() > 1.0 * 0.03  # noise std of Pressure is 0.03 bar


def test_offset_magnitude_is_in_noise_std_units() -> None:
    base_cfg = SimulatorConfig(speed=0, duration_s=30, seed=1)
    fault = FaultConfig(kind="offset", channel="Voltage", start_s=10, duration_s=10, magnitude=4.0)
    src = SimulatorSource(base_cfg, "sim")
    v = src.channels.index("Voltage")
    diff = matrix(simulate(base_cfg.model_copy(update={"faults": [fault]}))) - matrix(
        simulate(base_cfg)
    )
    assert diff[10:20, v] == pytest.approx(4.0 * src.noise_std[v])


def test_stuck_holds_value() -> None:
    cfg = SimulatorConfig(
        speed=0,
        duration_s=30,
        faults=[FaultConfig(kind="stuck", channel="Current", start_s=5, duration_s=10)],
    )
    current = matrix(simulate(cfg))[:, 2]
    assert np.all(current[5:15] == current[5])
    assert current[15] != current[5]


def test_fault_on_unknown_channel_is_a_config_error() -> None:
    fault = FaultConfig(kind="spike", channel="Nope", start_s=0, duration_s=1)
    cfg = SimulatorConfig(faults=[fault])
    with pytest.raises(ConfigError, match="Nope"):
        SimulatorSource(cfg, "sim")


def test_pacing_by_speed_uses_monotonic_start() -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    src = SimulatorSource(
        SimulatorConfig(speed=10.0, duration_s=5, sample_rate_hz=1.0),
        "sim",
        sleep=sleep,
        monotonic=lambda: now[0],
    )
    with pytest.raises(SourceExhausted):
        src.run(lambda r: None, lambda e: None, threading.Event())
    assert sleeps == pytest.approx([0.1] * 4)
    assert now[0] == pytest.approx(0.4)


def test_stop_ends_an_endless_run() -> None:
    stop = threading.Event()
    out: list[Reading] = []

    def emit(r: Reading) -> None:
        out.append(r)
        if len(out) == 100:
            stop.set()

    SimulatorSource(SimulatorConfig(speed=0), "sim").run(emit, lambda e: None, stop)
    assert len(out) == 100
