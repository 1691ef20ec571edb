"""Sliding windows over one stream: size W and hop H in samples.

Pure code (numpy only). A :class:`SlidingWindower` keeps the last W samples in a ring buffer and
emits a window every H samples once W samples have arrived. ``push_block`` takes many samples at
once and returns every window they complete, stacked, so a fast source is scored in batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent.records import Float32Array, FloatArray


@dataclass(frozen=True, slots=True)
class WindowBatch:
    """Windows completed by one ``push_block`` call.

    Attributes:
        data: Shape ``(K, W, C)``, float32, raw values, oldest sample first.
        start_ts: Shape ``(K,)``, float64 epoch seconds of each window's first sample.
        end_ts: Shape ``(K,)``, float64 epoch seconds of each window's last sample.
        end_index: Shape ``(K,)``, int64 index (in the pushed block) of each window's last sample.
        first_seq: Sequence number of the first window (then +1 each).
    """

    data: Float32Array
    start_ts: FloatArray
    end_ts: FloatArray
    end_index: npt.NDArray[np.int64]
    first_seq: int

    def __len__(self) -> int:
        return int(self.data.shape[0])


class SlidingWindower:
    """Cut a stream of ``(C,)`` samples into ``(W, C)`` windows every ``hop`` samples.

    Args:
        window: W, samples per window (≥ 2).
        hop: H, samples between window starts (1 ≤ H).
        channels: C.

    Raises:
        ValueError: window < 2, hop < 1 or channels < 1.

    >>> w = SlidingWindower(window=3, hop=2, channels=1)
    >>> b = w.push_block(np.arange(7.0).reshape(7, 1), np.arange(7.0))
    >>> b.data[:, :, 0].tolist(), b.end_index.tolist(), b.first_seq
    ([[0.0, 1.0, 2.0], [2.0, 3.0, 4.0], [4.0, 5.0, 6.0]], [2, 4, 6], 0)
    >>> w.push_block(np.array([[7.0], [8.0]]), np.array([7.0, 8.0])).data[:, :, 0].tolist()
    [[6.0, 7.0, 8.0]]
    """

    def __init__(self, window: int, hop: int, channels: int) -> None:
        if window < 2 or hop < 1 or channels < 1:
            raise ValueError(f"invalid window={window} hop={hop} channels={channels}")
        self.window = window
        self.hop = hop
        self.channels = channels
        self._values = np.zeros((0, channels), dtype=np.float32)
        self._ts = np.zeros(0, dtype=np.float64)
        self._seen = 0  # samples pushed so far
        self._next_end = window  # sample count at which the next window ends
        self._seq = 0

    @property
    def samples_seen(self) -> int:
        """Samples pushed since construction."""
        return self._seen

    def push_block(self, values: FloatArray | Float32Array, ts: FloatArray) -> WindowBatch:
        """Append ``values`` (shape ``(N, C)``) with timestamps ``ts`` (``(N,)``, epoch s).

        Returns:
            Every window that ends inside this block (possibly none).

        Raises:
            ValueError: shapes do not match ``(N, C)`` / ``(N,)``.
        """
        if values.ndim != 2 or values.shape[1] != self.channels or ts.shape != (values.shape[0],):
            raise ValueError(
                f"expected values (N, {self.channels}) and ts (N,), got {values.shape}, {ts.shape}"
            )
        n = values.shape[0]
        buf = np.concatenate([self._values, values.astype(np.float32, copy=False)])
        tbuf = np.concatenate([self._ts, ts.astype(np.float64, copy=False)])
        base = self._seen - self._values.shape[0]  # absolute index of buf[0]
        self._seen += n
        ends = np.arange(self._next_end, self._seen + 1, self.hop, dtype=np.int64)
        if ends.size:
            self._next_end = int(ends[-1]) + self.hop
        rel_end = ends - base  # exclusive end index within buf
        idx = rel_end[:, None] - self.window + np.arange(self.window)[None, :]
        data = buf[idx] if ends.size else np.zeros((0, self.window, self.channels), np.float32)
        batch = WindowBatch(
            data=np.ascontiguousarray(data, dtype=np.float32),
            start_ts=tbuf[rel_end - self.window] if ends.size else np.zeros(0),
            end_ts=tbuf[rel_end - 1] if ends.size else np.zeros(0),
            end_index=(ends - 1 - (self._seen - n)).astype(np.int64),
            first_seq=self._seq,
        )
        self._seq += int(ends.size)
        keep = self.window - 1
        self._values = buf[-keep:] if buf.shape[0] > keep else buf
        self._ts = tbuf[-keep:] if tbuf.shape[0] > keep else tbuf
        return batch
