"""Aggregate parts: one stream interval stored as more than one row.

An aggregate's id is ``<device>:<stream>:<interval start ms>`` (part 0). When the agent stops
within an interval, the shutdown flush stores the readings so far under that id; the next
process accumulates the rest of the interval and emits an aggregate with the SAME id. That one
is not a copy: it summarises other readings. The store keeps it as the next PART,
``<id>:<k>`` (:func:`agent.records.aggregate_part_id`, ``k = 1, 2, ...``), a record of its own
for the fleet (which stores parts as separate rows; docs/fleet-protocol.md, "Aggregate parts").

A new aggregate is a duplicate (not stored, the insert's caller sees False) when a stored part
of its interval summarises the same readings: same ``interval_s``, ``count`` and channel
statistics (:func:`same_channel_stats`: the same channels in the same order, ``count``, ``min``
and ``max`` exactly equal, ``mean`` and ``std`` equal within a tolerance). The tolerance is
needed because the same readings do not always give bit-identical sums: the pipeline gets
readings in blocks whose boundaries depend on thread timing (``agent.app`` drains whatever the
source queued, up to ``BATCH_MAX``), and :class:`agent.pipeline.aggregates.IntervalAggregator`
adds one partial sum per block, so a second replay of a file adds the same numbers in another
grouping and ``mean``/``std`` can differ in the last bits (seen: ``0.048957894736842096`` vs
``0.0489578947368421``), while count, min and max do not depend on the grouping. The score
fields (``max_score``, ``windows``, ``alert_count``)
are left out on purpose: a replay restarted from the start of its file regenerates the same
readings, but its detector starts with the calibration the first run stored and scores windows
the first run spent calibrating, so those fields differ while the readings are the same (the
first stored row is kept, as before parts existed). A stream without channel statistics (a
camera: ``channels`` is ``[]``) has only ``count`` left, so its rows are compared on every field.

Part numbers are ``1 + the largest stored part`` of the interval. They follow the rows still
in the store: if the budget evicted every part of an interval (oldest rows first, so within
seconds of a restart this needs a store at its budget) a later part would take an id the fleet
may already hold, and the fleet would answer ``duplicate`` for it.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Literal

from agent.records import MAX_AGGREGATE_PART, aggregate_part_id

#: What an aggregate whose interval is already stored stands for, by the kind of source
#: (:func:`agent.source_policies.repeat_policy`):
#:
#: * ``"part"``: a live source in real time (serial port, live camera, simulator at
#:   ``speed = 1``): readings after a restart are always new, so it is always the next part,
#:   even when its statistics happen to equal a stored part's (a constant sensor, a seeded
#:   simulator; such a piece was lost as a "duplicate").
#: * ``"same_readings"``: a recorded input (replay file, video file, image folder) that a
#:   restart reads again from its start: a duplicate when a stored part has the same readings
#:   (module docstring), else the next part.
#: * ``"ignore"``: a simulator faster than real time: its timeline restarts at the wall clock
#:   behind the intervals it already wrote, so a repeated interval is fiction, not news: a
#:   duplicate (what every repeat was before parts existed).
RepeatPolicy = Literal["part", "same_readings", "ignore"]


#: Stored parts of one interval: ``aggregate_id`` equal to the part-0 id, or inside
#: ``(<id>:, <id>;)`` (``;`` follows ``:`` in code point order), which is every ``<id>:<k>`` and
#: nothing else; both use the unique index on ``aggregate_id``.
_PARTS = "(aggregate_id = ?1 OR (aggregate_id > ?1 || ':' AND aggregate_id < ?1 || ';'))"

#: Channels text of the stored parts that may hold the same readings (equal ``interval_s`` and
#: ``count``; a stream without channel statistics also equal score fields):
#: :func:`same_channel_stats` decides.
_CANDIDATES = (
    f"SELECT channels FROM aggregates WHERE {_PARTS}"  # noqa: S608 - fixed text
    " AND interval_s = ?2 AND count = ?3"
    " AND (channels <> '[]' OR (max_score IS ?4 AND windows = ?5 AND alert_count = ?6))"
)
_IDS = f"SELECT aggregate_id FROM aggregates WHERE {_PARTS}"  # noqa: S608 - fixed text
_NEWEST = f"SELECT MAX(id) FROM aggregates WHERE {_PARTS}"  # noqa: S608 - fixed text

#: Unit of the tolerance of :func:`same_channel_stats`: ``2 * u`` (float64 unit roundoff
#: ``u = 2**-53``), the factor in the bounds there, times a margin of 4.
STATS_EPS = 4 * 2.0**-52


def same_channel_stats(stored: str, new: str) -> bool:
    """Whether two channels texts (as the store writes them) summarise the same readings.

    The channels (name and order), ``count``, ``min`` and ``max`` must be exactly equal: they do
    not depend on how the readings were grouped into blocks. ``mean`` and ``std`` come from sums
    that do (module docstring), so they must agree within the rounding error that regrouping
    can cause. With ``n`` readings in a channel of range ``R = max - min``, the aggregator sums
    ``d = x - x_0`` (``|d| <= R``) and ``d**2``; any order of summing ``n`` terms is within
    ``n * u * sum|terms|`` of the exact sum (Higham, "Accuracy and Stability of Numerical
    Algorithms", 2nd ed., section 4.2), so two groupings' means differ by at most
    ``2 * n * u * R`` plus the rounding of ``x_0 + mean(d)``, and their variances by at most
    ``6 * n * u * R**2`` plus the rounding of the variance itself. The tolerance is that bound
    with a margin (:data:`STATS_EPS`): ``STATS_EPS * (n * R + |mean|)`` for the mean and
    ``STATS_EPS * (3 * n * R**2 + var)`` for the variance (``std**2``). For a minute of 1 Hz
    readings that is about 5e-14 of the range: a single reading that really differs moves a
    mean or std far more, and becomes a part. ``None`` (a non-finite statistic) equals only
    ``None``.

    >>> a = '[{"channel":"p","count":19,"min":0.0,"max":1.0,"mean":0.0489578947368421,"std":0.2}]'
    >>> same_channel_stats(a, a.replace("0.0489578947368421", "0.048957894736842096"))
    True
    >>> same_channel_stats(a, a.replace("0.0489578947368421", "0.0489578947369"))
    False
    >>> same_channel_stats(a, a.replace('"max":1.0', '"max":1.0000000000000002'))
    False
    """
    if stored == new:
        return True
    a: list[dict[str, Any]] = json.loads(stored)
    b: list[dict[str, Any]] = json.loads(new)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if any(x.get(k) != y.get(k) for k in ("channel", "count", "min", "max")):
            return False
        n, lo, hi = x.get("count") or 0, x.get("min"), x.get("max")
        span = hi - lo if lo is not None and hi is not None else 0.0
        if not _close(x.get("mean"), y.get("mean"), n * span):
            return False
        sx, sy = x.get("std"), y.get("std")
        if not _close(None if sx is None else sx * sx, None if sy is None else sy * sy,
                      3 * n * span * span):
            return False
    return True


def _close(a: float | None, b: float | None, regrouping: float) -> bool:
    """``a`` and ``b`` within ``STATS_EPS * (regrouping + max(|a|, |b|))``; None only to None."""
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= STATS_EPS * (regrouping + max(abs(a), abs(b)))


def part_of(aggregate_id: str, stored_id: str) -> int:
    """Part number of ``stored_id`` among the parts of part-0 id ``aggregate_id``.

    >>> part_of("d:s:0", "d:s:0"), part_of("d:s:0", "d:s:0:12")
    (0, 12)
    """
    return 0 if stored_id == aggregate_id else int(stored_id[len(aggregate_id) + 1 :])


def next_part_id(
    conn: sqlite3.Connection,
    aggregate_id: str,
    interval_s: float,
    count: int,
    channels: str,
    max_score: float | None,
    windows: int,
    alert_count: int,
    policy: RepeatPolicy = "same_readings",
) -> str | None:
    """Id for an aggregate whose part-0 id ``aggregate_id`` is already stored.

    Args:
        conn: The store's connection (the caller holds its lock: no other writer in between).
        aggregate_id: The aggregate's part-0 id.
        interval_s: Interval length, seconds.
        count: Readings in the interval.
        channels: The channel statistics as the store writes them (JSON text).
        max_score: Largest window score, or None when nothing was scored.
        windows: Windows scored.
        alert_count: Alerts raised.
        policy: How a repeated interval is told apart from a copy (:data:`RepeatPolicy`).

    Returns:
        None when it is a duplicate (``"ignore"``; ``"same_readings"`` and a stored part with
        the same readings), else the id of the next part.

    Raises:
        sqlite3.Error: A read failed.
        ValueError: The interval already has :data:`agent.records.MAX_AGGREGATE_PART` parts.
    """
    if policy == "ignore":
        return None
    if policy == "same_readings" and any(
        same_channel_stats(stored, channels)
        for (stored,) in conn.execute(
            _CANDIDATES, (aggregate_id, interval_s, count, max_score, windows, alert_count)
        )
    ):
        return None
    parts = [part_of(aggregate_id, r[0]) for r in conn.execute(_IDS, (aggregate_id,))]
    last = max(parts, default=0)
    if last >= MAX_AGGREGATE_PART:
        raise ValueError(f"aggregate {aggregate_id} already has {MAX_AGGREGATE_PART} parts")
    return aggregate_part_id(aggregate_id, last + 1)


def newest_row(conn: sqlite3.Connection, aggregate_id: str) -> int:
    """Row id of the most recently stored part of the interval whose part-0 id is
    ``aggregate_id`` (0 when none is stored). Row ids only grow (``AUTOINCREMENT``), so it tells
    whether this process wrote one.

    Raises:
        sqlite3.Error: The read failed.
    """
    (newest,) = conn.execute(_NEWEST, (aggregate_id,)).fetchone()
    return int(newest or 0)
