"""Value types that flow through the agent: Reading, Frame, Window, Score, Alert, Aggregate.

Conventions (the same everywhere in the agent):
    * wall-clock timestamps are float epoch seconds, UTC (``time.time()``); they become ISO 8601
      strings with ``Z`` only on the wire (:func:`iso_utc`);
    * sensor values are ``numpy.float64`` arrays of shape ``(C,)`` in the stream's channel order;
    * a window is ``float32`` of shape ``(W, C)``: W samples (oldest first) by C channels;
    * a camera frame is ``uint8`` of shape ``(H, W)`` (grayscale) or ``(H, W, 3)`` (BGR).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Float32Array = npt.NDArray[np.float32]


#: The reading times :func:`iso_utc` can format: years 1 .. 9999, epoch seconds.
MIN_EPOCH_S = -62_135_596_800.0
MAX_EPOCH_S = 253_402_300_799.0


def iso_utc(ts: float) -> str:
    """Format epoch seconds as ISO 8601 UTC with millisecond precision and a ``Z`` suffix.

    >>> iso_utc(0.0)
    '1970-01-01T00:00:00.000Z'
    """
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[
        :-3
    ] + "Z"


@dataclass(frozen=True, slots=True)
class Reading:
    """One multichannel sample from a source.

    Attributes:
        stream: Name of the stream (from the config) that produced it.
        ts: Sample time, epoch seconds UTC (from the record, or the receive time).
        values: Shape ``(C,)``, float64, finite, in the stream's channel order.
        received_mono: ``time.monotonic()`` when the agent received it (latency measurement).
    """

    stream: str
    ts: float
    values: FloatArray
    received_mono: float = 0.0


#: Longest ``source.file`` text in an alert payload (characters; the wire limit of
#: ``cloud_sync.protocol.AlertSourceBody.file``). Longer names keep their end.
MAX_SOURCE_FILE_CHARS = 1024


def score_text(score: float) -> str:
    """A score for a console line: two decimals, or three significant digits when it is too
    large for that (an off-scale window scores the largest float, 1.8e308).

    >>> score_text(7.304), score_text(1.7976931348623157e308), score_text(float("nan"))
    ('7.30', '1.8e+308', 'nan')
    """
    return f"{score:.2f}" if abs(score) < 1e9 else f"{score:.3g}"


def wire_text(text: str) -> str:
    """``text`` safe for UTF-8 JSON: file-name bytes that are not UTF-8 (``os.fsdecode`` keeps
    them as lone surrogates, ``surrogateescape``) become U+FFFD.

    >>> import os
    >>> wire_text(os.fsdecode(b"good_\\xff.png")), wire_text("crack_01.png")
    ('good_\ufffd.png', 'crack_01.png')
    """
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate surrogateescape did not make
        raw = text.encode("utf-8", "replace")
    return raw.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class FrameOrigin:
    """Where a frame of a recorded camera input came from (None for a live camera).

    Attributes:
        file: An image folder's file, relative to the folder, or a video file's name, as
            ``os.fsdecode`` gives it (bytes that are not UTF-8 kept as lone surrogates;
            :func:`wire_text` makes it safe for the payload).
        frame: A video file's frame index, 0-based from the file's first frame (a looped file
            counts from 0 again each pass); None for an image of a folder.
    """

    file: str
    frame: int | None = None

    def to_payload(self) -> dict[str, object]:
        """The alert payload's ``source`` object: ``{"file": …}`` plus ``"frame"`` for a video.

        >>> FrameOrigin("line1.avi", 1234).to_payload()
        {'file': 'line1.avi', 'frame': 1234}
        """
        name = wire_text(self.file)
        if len(name) > MAX_SOURCE_FILE_CHARS:
            name = "\u2026" + name[-(MAX_SOURCE_FILE_CHARS - 1):]
        out: dict[str, object] = {"file": name}
        if self.frame is not None:
            out["frame"] = self.frame
        return out


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    """Where a camera alert's snapshot goes: the payload's ``snapshot`` object names it, never
    holds its bytes (:mod:`agent.services.snapshots`).

    Attributes:
        snapshot_id: The snapshot's id: the alert's id (one snapshot per alert).
        topic: The retained latest-snapshot topic of the stream (JPEG); None without MQTT.
        heatmap_topic: The retained latest-heatmap topic (PNG); None without MQTT or heatmap.
    """

    snapshot_id: str
    topic: str | None = None
    heatmap_topic: str | None = None

    def to_payload(self) -> dict[str, object]:
        """The alert payload's ``snapshot`` object (topics only when set).

        >>> SnapshotRef("gw:cam:3", "edge/gw/cam/snapshot").to_payload()
        {'id': 'gw:cam:3', 'topic': 'edge/gw/cam/snapshot'}
        """
        out: dict[str, object] = {"id": self.snapshot_id}
        if self.topic is not None:
            out["topic"] = self.topic
        if self.heatmap_topic is not None:
            out["heatmap_topic"] = self.heatmap_topic
        return out


@dataclass(frozen=True, slots=True)
class Frame:
    """One camera image from a camera source.

    Attributes:
        stream: Name of the stream (from the config) that produced it.
        ts: Capture time, epoch seconds UTC (wall clock when the grabber read it).
        image: ``uint8``, ``(H, W)`` grayscale or ``(H, W, 3)`` BGR; already resized to the
            model's input size when the source was given one.
        received_mono: ``time.monotonic()`` at capture (frame age = now - received_mono).
        seq: Frame number since the source started (gaps = frames dropped for newer ones).
        origin: The file (and video frame index) it came from; None for a live camera.
        captured: The image as captured (any size and pixel type the source reads), before
            the conversion to the model's input; the snapshot of an alerting frame is made
            from it. None when the source kept no copy (then ``image`` is used).
    """

    stream: str
    ts: float
    image: npt.NDArray[np.uint8]
    received_mono: float = 0.0
    seq: int = 0
    origin: FrameOrigin | None = None
    captured: npt.NDArray[Any] | None = None


@dataclass(frozen=True, slots=True)
class Window:
    """A sliding window over one stream.

    Attributes:
        stream: Stream name.
        seq: Window sequence number within the stream, from 0, monotonic.
        start_ts: Timestamp of the first sample, epoch seconds UTC.
        end_ts: Timestamp of the last sample, epoch seconds UTC.
        data: Shape ``(W, C)``, float32, raw (unscaled) values, oldest sample first.
        received_mono: Monotonic receive time of the newest sample.
    """

    stream: str
    seq: int
    start_ts: float
    end_ts: float
    data: Float32Array
    received_mono: float = 0.0


@dataclass(frozen=True, slots=True)
class Score:
    """The detector's verdict on one window.

    Attributes:
        window: The window scored.
        score: Anomaly score (dimensionless; larger is more anomalous), after smoothing.
        threshold: Threshold in the same units; NaN while calibrating.
        contributions: Shape ``(C,)``, float64, per-channel share of the score, sums to 1.
        calibrating: True while the stream is still in its calibration period.
    """

    window: Window
    score: float
    threshold: float
    contributions: FloatArray
    calibrating: bool = False

    @property
    def is_anomalous(self) -> bool:
        """True when calibrated and the score exceeds the threshold."""
        return (not self.calibrating) and self.score > self.threshold


@dataclass(frozen=True, slots=True)
class TopChannel:
    """A channel that contributed to an alert and its share of the score (0..1)."""

    channel: str
    contribution: float


@dataclass(frozen=True, slots=True)
class Explanation:
    """What a univariate stream's alerting window looked like against what was expected.

    Attributes:
        expected: The baseline level in force (the calibration mean, moved by the bounded
            drift adaptation), channel units.
        observed: The alerting window's mean, channel units.
        deviation: ``observed − expected``, channel units.
        deviation_sigma: ``deviation`` over the calibration scale (std, floored), in sigmas.
    """

    expected: float
    observed: float
    deviation: float
    deviation_sigma: float

    def to_payload(self) -> dict[str, float]:
        """The payload's ``explanation`` object (values rounded to 6 decimals)."""
        return {"expected": round(self.expected, 6), "observed": round(self.observed, 6),
                "deviation": round(self.deviation, 6),
                "deviation_sigma": round(self.deviation_sigma, 4)}


#: Version of the alert payload (:meth:`Alert.to_payload`); 1 had no lifecycle keys.
ALERT_SCHEMA = 2

AlertEventKind = Literal["raised", "updated", "cleared"]
#: The lifecycle events of an episode, in the order they can happen.
EVENTS: tuple[AlertEventKind, ...] = ("raised", "updated", "cleared")


@dataclass(frozen=True, slots=True)
class Alert:
    """An anomaly alert, as stored in the outbox and published over MQTT.

    Attributes:
        alert_id: Unique and stable across retries: ``<device>:<stream>:<seq>``.
        device_id: The gateway's device id.
        stream: Stream name.
        seq: Per-stream alert sequence number, monotonic across restarts (from the store).
        model_name: Name of the model package that scored the window.
        model_version: Integer version of that package.
        score: Score of the window that raised the alert.
        threshold: Threshold in force.
        window_start: First sample time of the triggering window, epoch seconds UTC.
        window_end: Last sample time of the triggering window, epoch seconds UTC.
        raised_at: When the alert was raised, epoch seconds UTC.
        top_channels: Channels that contributed most, largest first.
        origin: A recorded camera input's file (and video frame) of the alerting frame; None
            for sensor streams and live cameras (the payload then has no ``source`` key).
        explanation: Expected value and deviation of a univariate stream's alerting window;
            None for multichannel and camera streams (the payload then has no
            ``explanation`` key).
        snapshot: A camera alert's snapshot (id and retained topics); None for sensor streams
            and cameras without snapshots (the payload then has no ``snapshot`` key).
        event: The episode's lifecycle event this record is (:data:`EVENTS`): ``raised``
            (the episode starts: what schema 1 called an alert), ``updated`` (its peak score
            rose), ``cleared`` (the hysteresis ended it).
        episode_id: The ``alert_id`` of the episode's ``raised`` event (None: this record's
            own ``alert_id``, which is what a ``raised`` event carries).
        peak_score: The episode's largest score so far (``updated``, ``cleared``); None on
            ``raised`` (its ``score`` is the peak so far).
        reason: On ``cleared``: ``recovered`` (the hysteresis ended the episode) or
            ``end_of_input`` (a recorded input ended while it was open); else None.
    """

    alert_id: str
    device_id: str
    stream: str
    seq: int
    model_name: str
    model_version: int
    score: float
    threshold: float
    window_start: float
    window_end: float
    raised_at: float
    top_channels: tuple[TopChannel, ...] = field(default_factory=tuple)
    origin: FrameOrigin | None = None
    explanation: Explanation | None = None
    snapshot: SnapshotRef | None = None
    event: AlertEventKind = "raised"
    episode_id: str | None = None
    peak_score: float | None = None
    reason: str | None = None

    def to_payload(self) -> dict[str, object]:
        """Return the documented JSON payload (schema version 2) for MQTT and the fleet.

        Schema 2 is schema 1 plus ``event`` and ``episode_id`` (always), ``peak_score``
        (``updated`` and ``cleared``) and ``reason`` (``cleared``): docs/mqtt.md, "Alert
        lifecycle". ``window_*``,
        ``score`` and ``threshold`` are those of the window the event is about (the
        clearing window for ``cleared``); ``raised_at`` is when the event was produced.
        ``source`` (optional) is present only on events of recorded camera inputs,
        ``explanation`` (optional) only on events of univariate streams.
        """
        payload: dict[str, object] = {
            "schema": ALERT_SCHEMA,
            "event": self.event,
            "episode_id": self.episode_id or self.alert_id,
            "alert_id": self.alert_id,
            "device_id": self.device_id,
            "stream": self.stream,
            "seq": self.seq,
            "model": {"name": self.model_name, "version": self.model_version},
            "score": round(float(self.score), 6),
            "threshold": round(float(self.threshold), 6),
            "window_start": iso_utc(self.window_start),
            "window_end": iso_utc(self.window_end),
            "raised_at": iso_utc(self.raised_at),
            "top_channels": [
                {"channel": t.channel, "contribution": round(t.contribution, 4)}
                for t in self.top_channels
            ],
        }
        if self.peak_score is not None:
            payload["peak_score"] = round(float(self.peak_score), 6)
        if self.reason is not None:
            payload["reason"] = self.reason
        if self.origin is not None:
            payload["source"] = self.origin.to_payload()
        if self.explanation is not None:
            payload["explanation"] = self.explanation.to_payload()
        if self.snapshot is not None:
            payload["snapshot"] = self.snapshot.to_payload()
        return payload

    def console_line(self) -> str:
        """The alert's line on the console (``console_alerts``): id, score and threshold, the
        window (an instant for a single frame), then the file (and video frame) of a recorded
        camera input and the top channels when there are any (no empty ``top:``).

        >>> a = Alert("gw:cam:1", "gw", "cam", 1, "m", 1, 0.91, 0.5, 0.0, 0.0, 0.0,
        ...           origin=FrameOrigin("exp1_num_4.jpg"))
        >>> a.console_line()
        'ALERT gw:cam:1 score 0.91 > threshold 0.50 at 1970-01-01T00:00:00.000Z file exp1_num_4.jpg'
        """
        if self.event != "raised":
            return (f"{self.event.upper()} {self.episode_id or self.alert_id} "
                    f"({self.alert_id}) score {score_text(self.score)}, peak "
                    f"{score_text(self.peak_score or self.score)}, threshold "
                    f"{score_text(self.threshold)} at {iso_utc(self.window_end)}")
        parts = [f"ALERT {self.alert_id} score {score_text(self.score)} > threshold "
                 f"{score_text(self.threshold)}"]
        if self.window_start == self.window_end:
            parts.append(f"at {iso_utc(self.window_end)}")
        else:
            parts.append(f"window {iso_utc(self.window_start)} .. {iso_utc(self.window_end)}")
        if self.origin is not None:
            where = self.origin.to_payload()
            parts.append(f"file {where['file']}")
            if self.origin.frame is not None:
                parts.append(f"frame {self.origin.frame}")
        if self.top_channels:
            parts.append("top: " + ", ".join(
                f"{t.channel} {t.contribution:.0%}" for t in self.top_channels))
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """Per-channel statistics over one aggregate interval (units of the channel)."""

    channel: str
    count: int
    min: float
    max: float
    mean: float
    std: float


@dataclass(frozen=True, slots=True)
class Aggregate:
    """Per-stream summary over one interval ``[interval_start, interval_start + interval_s)``.

    Attributes:
        device_id: The gateway's device id.
        stream: Stream name.
        interval_start: Interval start, epoch seconds UTC, aligned to ``interval_s``.
        interval_s: Interval length in seconds.
        count: Readings in the interval.
        channels: Per-channel stats, in channel order.
        max_score: Largest window score in the interval (NaN when none was scored).
        windows: Windows scored in the interval.
        alert_count: Alerts raised in the interval.
    """

    device_id: str
    stream: str
    interval_start: float
    interval_s: float
    count: int
    channels: tuple[ChannelStats, ...]
    max_score: float
    windows: int
    alert_count: int

    @property
    def aggregate_id(self) -> str:
        """Stable id of part 0: ``<device>:<stream>:<interval_start as integer ms>``.

        Further parts of the same interval (the agent restarted within it) take
        :func:`aggregate_part_id` of this id; the store decides the part
        (:mod:`agent.store.parts`).
        """
        return f"{self.device_id}:{self.stream}:{round(self.interval_start * 1000)}"


#: Largest aggregate part number (the wire pattern allows up to 6 digits).
MAX_AGGREGATE_PART = 999_999


def aggregate_part_id(aggregate_id: str, part: int) -> str:
    """The id of part ``part`` of an interval whose part-0 id is ``aggregate_id``.

    Part 0 is the id itself; part ``k >= 1`` is ``<id>:<k>`` (no leading zeros, so each part has
    one spelling). See ``cloud_sync.protocol.AGGREGATE_ID_PATTERN``.

    >>> aggregate_part_id("gw1:pump1:60000", 0), aggregate_part_id("gw1:pump1:60000", 2)
    ('gw1:pump1:60000', 'gw1:pump1:60000:2')

    Raises:
        ValueError: ``part`` is negative or above :data:`MAX_AGGREGATE_PART`.
    """
    if not 0 <= part <= MAX_AGGREGATE_PART:
        raise ValueError(f"aggregate part {part} out of range 0..{MAX_AGGREGATE_PART}")
    return aggregate_id if part == 0 else f"{aggregate_id}:{part}"
