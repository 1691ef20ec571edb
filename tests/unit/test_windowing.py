"""SlidingWindower against a naive reference, for any split of the stream into blocks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from agent.pipeline.windowing import SlidingWindower, WindowBatch


def reference(values: np.ndarray, ts: np.ndarray, window: int, hop: int) -> tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray
]:
    """Naive windows: data (K, W, C), start_ts, end_ts, absolute end index (K,)."""
    ends = list(range(window - 1, values.shape[0], hop))
    data = np.stack([values[e - window + 1 : e + 1] for e in ends]) if ends else np.zeros(
        (0, window, values.shape[1])
    )
    starts = np.array([ts[e - window + 1] for e in ends])
    return data.astype(np.float32), starts, ts[ends], np.array(ends, dtype=np.int64)


def random_splits(n: int, rng: np.random.Generator, max_block: int) -> list[int]:
    """Cut points splitting range(n) into blocks of 0..max_block samples (empty blocks too)."""
    cuts = [0]
    while cuts[-1] < n:
        cuts.append(min(n, cuts[-1] + int(rng.integers(0, max_block + 1))))
    return cuts


def push_all(
    w: SlidingWindower, values: np.ndarray, ts: np.ndarray, cuts: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Push the blocks given by ``cuts``; return concatenated data, ts, absolute ends, seqs."""
    datas, starts, ends_ts, ends, seqs = [], [], [], [], []
    for a, b in itertools.pairwise(cuts):
        batch = w.push_block(values[a:b], ts[a:b])
        assert isinstance(batch, WindowBatch)
        k = len(batch)
        assert batch.data.shape == (k, w.window, w.channels)
        assert batch.data.dtype == np.float32
        assert batch.start_ts.shape == batch.end_ts.shape == batch.end_index.shape == (k,)
        assert np.all((batch.end_index >= 0) & (batch.end_index < b - a))
        datas.append(batch.data)
        starts.append(batch.start_ts)
        ends_ts.append(batch.end_ts)
        ends.append(batch.end_index + a)
        seqs.append(batch.first_seq + np.arange(k))
    return (
        np.concatenate(datas),
        np.concatenate(starts),
        np.concatenate(ends_ts),
        np.concatenate(ends),
        np.concatenate(seqs),
    )


@pytest.mark.parametrize(
    ("window", "hop"), [(2, 1), (10, 1), (5, 3), (4, 4), (3, 7), (10, 25)]
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_block_splits_match_reference(window: int, hop: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, c = 300, 3
    values = rng.normal(230.0, 5.0, size=(n, c))
    ts = 1_700_000_000.0 + np.cumsum(rng.uniform(0.1, 2.0, size=n))
    want_data, want_start, want_end, want_idx = reference(values, ts, window, hop)
    assert want_data.shape[0] > 0

    one = push_all(SlidingWindower(window, hop, c), values, ts, [0, n])
    for max_block in (1, window - 1, 2 * window + hop):
        many = push_all(
            SlidingWindower(window, hop, c), values, ts, random_splits(n, rng, max_block)
        )
        for got in (one, many):
            data, start, end, idx, seq = got
            np.testing.assert_array_equal(data, want_data)
            np.testing.assert_array_equal(start, want_start)
            np.testing.assert_array_equal(end, want_end)
            np.testing.assert_array_equal(idx, want_idx)
            np.testing.assert_array_equal(seq, np.arange(want_data.shape[0]))


def test_per_sample_pushes_emit_on_the_right_samples() -> None:
    w = SlidingWindower(window=3, hop=2, channels=1)
    emitted = []
    for i in range(9):
        b = w.push_block(np.array([[float(i)]]), np.array([float(i)]))
        emitted.append(len(b))
        if len(b):
            assert b.end_index.tolist() == [0]
            assert b.data[0, :, 0].tolist() == [i - 2.0, i - 1.0, float(i)]
    # windows end at samples 2, 4, 6, 8
    assert emitted == [0, 0, 1, 0, 1, 0, 1, 0, 1]
    assert w.samples_seen == 9


def test_hop_larger_than_window_skips_samples() -> None:
    w = SlidingWindower(window=2, hop=5, channels=1)
    b = w.push_block(np.arange(13.0).reshape(13, 1), np.arange(13.0) + 100)
    assert b.data[:, :, 0].tolist() == [[0.0, 1.0], [5.0, 6.0], [10.0, 11.0]]
    assert b.start_ts.tolist() == [100.0, 105.0, 110.0]
    assert b.end_ts.tolist() == [101.0, 106.0, 111.0]
    # the next window ends at sample 16 (absolute), i.e. index 3 of the next block
    b2 = w.push_block(np.arange(13.0, 20.0).reshape(7, 1), np.arange(13.0, 20.0) + 100)
    assert b2.data[:, :, 0].tolist() == [[15.0, 16.0]]
    assert b2.end_index.tolist() == [3]
    assert b2.first_seq == 3


def test_empty_block_returns_empty_batch() -> None:
    w = SlidingWindower(window=4, hop=1, channels=2)
    b = w.push_block(np.zeros((0, 2)), np.zeros(0))
    assert len(b) == 0
    assert b.data.shape == (0, 4, 2)
    assert b.first_seq == 0
    assert w.samples_seen == 0


def test_values_are_stored_as_float32() -> None:
    w = SlidingWindower(window=2, hop=1, channels=1)
    b = w.push_block(np.array([[230.1], [230.2]]), np.array([0.0, 1.0]))
    assert b.data.dtype == np.float32
    np.testing.assert_array_equal(b.data[0, :, 0], np.array([230.1, 230.2], dtype=np.float32))


@pytest.mark.parametrize(
    ("window", "hop", "channels"), [(1, 1, 1), (0, 1, 1), (3, 0, 1), (3, 1, 0)]
)
def test_invalid_construction(window: int, hop: int, channels: int) -> None:
    with pytest.raises(ValueError, match="invalid window"):
        SlidingWindower(window, hop, channels)


@pytest.mark.parametrize(
    ("values", "ts"),
    [
        (np.zeros((5, 3)), np.zeros(5)),  # wrong channel count
        (np.zeros(5), np.zeros(5)),  # 1-D values
        (np.zeros((5, 2, 1)), np.zeros(5)),  # 3-D values
        (np.zeros((5, 2)), np.zeros(4)),  # ts length mismatch
        (np.zeros((5, 2)), np.zeros((5, 1))),  # ts not 1-D
    ],
)
def test_shape_errors(values: np.ndarray, ts: np.ndarray) -> None:
    w = SlidingWindower(window=3, hop=1, channels=2)
    with pytest.raises(ValueError, match="expected values"):
        w.push_block(values, ts)
    # a rejected block leaves no trace
    assert w.samples_seen == 0
    b = w.push_block(np.ones((3, 2)), np.arange(3.0))
    assert len(b) == 1 and b.first_seq == 0
