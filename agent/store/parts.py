"""Aggregate parts: one stream interval stored as more than one row.

An aggregate's id is ``<device>:<stream>:<interval start ms>`` (part 0). When the agent stops
within an interval, the shutdown flush stores the readings so far under that id; the next
process accumulates the rest of the interval and emits an aggregate with the SAME id. That one
is not a copy: it summarises other readings. The store keeps it as the next PART,
``<id>:<k>`` (:func:`agent.records.aggregate_part_id`, ``k = 1, 2, ...``), a record of its own
for the fleet (which stores parts as separate rows; README, "Aggregate parts").

A new aggregate is a duplicate (not stored, the insert's caller sees False) when a stored part
of its interval summarises the same readings: same ``interval_s``, ``count`` and channel
statistics (the stored channels JSON text, floats written in their shortest round-trip form, so
equal text means equal values). The score fields (``max_score``, ``windows``, ``alert_count``)
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

import sqlite3
from typing import Literal

from agent.records import MAX_AGGREGATE_PART, aggregate_part_id

#: What an aggregate whose interval is already stored stands for, by the kind of source
#: (:func:`agent.app.repeat_policy`):
#:
#: * ``"part"``: a live source in real time (serial port, live camera, simulator at
#:   ``speed = 1``): readings after a restart are always new, so it is always the next part,
#:   even when its statistics happen to equal a stored part's (a constant sensor, a seeded
#:   simulator; a tester lost such a piece as a "duplicate").
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

_SAME = (
    f"SELECT aggregate_id FROM aggregates WHERE {_PARTS}"  # noqa: S608 - fixed text
    " AND interval_s = ?2 AND count = ?3 AND channels = ?4"
    " AND (channels <> '[]' OR (max_score IS ?5 AND windows = ?6 AND alert_count = ?7))"
    " LIMIT 1"
)
_IDS = f"SELECT aggregate_id FROM aggregates WHERE {_PARTS}"  # noqa: S608 - fixed text


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
    if policy == "same_readings" and conn.execute(
        _SAME, (aggregate_id, interval_s, count, channels, max_score, windows, alert_count)
    ).fetchone() is not None:
        return None
    parts = [part_of(aggregate_id, r[0]) for r in conn.execute(_IDS, (aggregate_id,))]
    last = max(parts, default=0)
    if last >= MAX_AGGREGATE_PART:
        raise ValueError(f"aggregate {aggregate_id} already has {MAX_AGGREGATE_PART} parts")
    return aggregate_part_id(aggregate_id, last + 1)
