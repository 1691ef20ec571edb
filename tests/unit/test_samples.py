"""Retraining samples: Algorithm R reservoir, window reconstruction, uploader retries."""

from __future__ import annotations

import random

import numpy as np
import pytest

from agent.config.loader import parse_config
from agent.errors import ConfigError
from agent.services.samples import Reservoir, SampleCollector, SamplesConfig, SampleUploader
from cloud_sync.errors import FleetUnavailable
from cloud_sync.protocol import SampleBatch


def test_reservoir_is_uniform() -> None:
    counts = np.zeros(20)
    rng = random.Random(3)
    for _ in range(4000):
        r = Reservoir(5, rng)
        for i in range(20):
            r.offer(np.array([[float(i)]]))
        for item in r.items:
            counts[int(item[0, 0])] += 1
    # each of the 20 items is kept with probability 5/20: 1000 of 4000 runs
    assert counts.sum() == 20_000
    assert np.all(np.abs(counts - 1000) < 120)


def _collector(window: int = 3, size: int = 100) -> SampleCollector:
    return SampleCollector("gw1", "s", ("a", "b"), window, 1.0, ("m", 1), "h", size,
                           random.Random(0))


def test_collector_rebuilds_normal_windows_across_blocks() -> None:
    col = _collector()
    data = np.arange(20.0).reshape(10, 2)
    # block 1: rows 0..4, windows end at 2,3,4; block 2: rows 5..9, windows end at 0..4
    col.observe(data[:5], np.array([2, 3, 4]), np.array([np.nan, 1.0, 9.0]), 5.0)
    col.observe(data[5:], np.array([0, 1, 2, 3, 4]), np.array([1.0] * 5), 5.0)
    [batch] = col.take(reservoir=True)
    wins = np.asarray(batch.windows)
    assert batch.kind == "reservoir" and wins.shape == (6, 3, 2)  # NaN and 9.0 > 5 left out
    ends = sorted(int(w[-1, 0]) // 2 for w in wins)
    assert ends == [3, 5, 6, 7, 8, 9]
    for w in wins:  # consecutive rows
        np.testing.assert_array_equal(np.diff(w[:, 0]), [2.0, 2.0])
    assert col.take(reservoir=True) == []  # started over


def test_reservoir_windows_start_after_the_calibration_rows() -> None:
    """A window that ends just after calibration holds calibration rows, which the fleet fits
    on: it is not offered. Rows 0..4 calibrate; the pipeline scores windows ending at 5 on."""
    col = _collector(window=3)
    data = np.arange(24.0).reshape(12, 2)
    col.add_calibration(data[:5])
    ends = np.arange(2, 8)
    col.observe(data[:8], ends, np.where(ends >= 5, 1.0, np.nan), 5.0)
    col.observe(data[8:], np.arange(4), np.ones(4), 5.0)
    batches = col.take(reservoir=True)
    [res] = [b for b in batches if b.kind == "reservoir"]
    starts = sorted(int(w[0][0]) // 2 for w in res.windows)
    assert starts == [5, 6, 7, 8, 9]  # windows starting at rows 3 and 4 are left out
    # a later recalibration (rows 12..16 here) moves the bound again
    col.add_calibration(data[:5])
    more = np.arange(24.0, 48.0).reshape(12, 2)
    ends = np.arange(2, 12)
    col.observe(more, ends, np.where(ends >= 5, 1.0, np.nan), 5.0)
    [res] = [b for b in col.take(reservoir=True) if b.kind == "reservoir"]
    assert sorted(int(w[0][0]) // 2 for w in res.windows) == [17, 18, 19, 20, 21]


def test_calibration_is_sent_once_and_kept_on_failure() -> None:
    col = _collector()
    col.add_calibration(np.ones((40, 2)))

    class Client:
        def __init__(self) -> None:
            self.fail = True
            self.sent: list[SampleBatch] = []

        def post_samples(self, batch: SampleBatch) -> int:
            if self.fail:
                raise FleetUnavailable("down")
            self.sent.append(batch)
            return len(batch.windows)

    client = Client()
    up = SampleUploader(client, {"s": col}, interval_s=3600)
    assert up.upload_once(reservoir=False) == 1
    client.fail = False
    assert up.upload_once(reservoir=False) == 0
    [batch] = client.sent
    assert batch.kind == "calibration" and np.asarray(batch.windows).shape == (1, 40, 2)
    assert batch.model is not None and batch.model.version == 1 and batch.config_hash == "h"
    assert up.upload_once(reservoir=False) == 0 and len(client.sent) == 1


def test_samples_config_defaults_off_and_needs_fleet() -> None:
    assert SamplesConfig().enabled is False
    text = ('[[streams]]\nname = "a"\n[streams.source]\nkind = "simulator"\n'
            "[samples]\nenabled = true\n")
    with pytest.raises(ConfigError):
        parse_config(text, env={})
