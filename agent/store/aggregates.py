"""The store's aggregates: one row per stream and interval, a restart within an interval
stored as the interval's next part (:mod:`agent.store.parts`).

:class:`StoreAggregates` is a base of :class:`agent.store.sqlite.Store`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from agent.errors import StoreError
from agent.records import Aggregate, iso_utc
from agent.store import maintenance as mt
from agent.store import parts
from agent.store.budget import StoreBudget
from agent.store.connection import log


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


class StoreAggregates(StoreBudget):
    """The aggregates of :class:`agent.store.sqlite.Store`."""

    def add_aggregate(self, agg: Aggregate, policy: parts.RepeatPolicy = "same_readings") -> bool:
        """Store an aggregate under ``aggregate_id``, or as the next part of its interval.

        When the interval is already stored (the agent restarted within it, or the stream's
        timestamps went back to it: a clock step back), ``policy`` (by the stream's kind of
        source, :data:`agent.store.parts.RepeatPolicy`) decides: a live source's aggregate is
        the next part, ``<aggregate_id>:<k>``, logged once with its cause (a part stored by
        this process: the timestamps went back; else: a restart); a recorded input's is a
        duplicate when a stored part has the same readings (a replay of the same file stays
        idempotent), else the next part; a fast simulator's is a duplicate. Nothing is written
        for a duplicate. Non-finite numbers become NULL.

        Returns:
            True when stored (as any part), False when it duplicates a stored part.

        Raises:
            StoreError: The write failed (also: the interval has run out of part numbers).
        """
        channels = json.dumps(
            [
                {
                    "channel": c.channel,
                    "count": int(c.count),
                    "min": _finite_or_none(c.min),
                    "max": _finite_or_none(c.max),
                    "mean": _finite_or_none(c.mean),
                    "std": _finite_or_none(c.std),
                }
                for c in agg.channels
            ],
            ensure_ascii=False,
            separators=(",", ":"),
        )
        try:
            stored_as, went_back = self._insert_aggregate(agg, channels, policy)
        except StoreError as exc:
            if mt.is_disk_full(exc):
                self._make_room()  # for the next ones; this one is the caller's to count
            self._maintain()
            raise
        if stored_as is not None and stored_as != agg.aggregate_id:
            log.info(
                "stream %s: interval starting %s was already stored %s; these readings are "
                "stored as part %s",
                agg.stream, iso_utc(agg.interval_start),
                "by this process (the stream's timestamps went back to it: a clock step back)"
                if went_back else "(the agent restarted within it)",
                stored_as,
            )
        if stored_as is not None and self._metrics is not None:
            self._metrics.aggregates_total.labels(stream=agg.stream).inc()
        self._maintain()
        return stored_as is not None

    def _insert_aggregate(
        self, agg: Aggregate, channels: str, policy: parts.RepeatPolicy
    ) -> tuple[str | None, bool]:
        """The id the aggregate was stored under (None for a duplicate), and whether the
        interval's stored parts include one this process wrote (rows above the store's
        :attr:`_aggregates_base`: the timestamps went back, no restart)."""
        sql = (
            "INSERT {} INTO aggregates (aggregate_id, device_id, stream, interval_start,"
            " interval_s, count, channels, max_score, windows, alert_count) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        max_score = _finite_or_none(agg.max_score)
        row = (agg.device_id, agg.stream, agg.interval_start, agg.interval_s, agg.count,
               channels, max_score, agg.windows, agg.alert_count)
        with self._use("add_aggregate") as conn:
            if conn.execute(sql.format("OR IGNORE"), (agg.aggregate_id, *row)).rowcount == 1:
                return agg.aggregate_id, False
            try:
                part_id = parts.next_part_id(
                    conn, agg.aggregate_id, agg.interval_s, agg.count, channels, max_score,
                    agg.windows, agg.alert_count, policy,
                )
            except ValueError as exc:
                raise StoreError(str(exc), op="add_aggregate", path=self.path) from None
            if part_id is None:
                return None, False
            went_back = parts.newest_row(conn, agg.aggregate_id) > self._aggregates_base
            conn.execute(sql.format(""), (part_id, *row))
            return part_id, went_back

    def aggregates(
        self, stream: str | None = None, since: float | None = None
    ) -> list[dict[str, Any]]:
        """Return stored aggregates ordered by ``interval_start`` (then id).

        Args:
            stream: Only this stream.
            since: Only intervals starting at or after this time, epoch seconds UTC.

        Returns:
            Dicts with the ``aggregates`` columns; ``channels`` is the parsed list of
            ``{channel, count, min, max, mean, std}``; ``max_score`` is None when nothing was
            scored.

        Raises:
            StoreError: The read failed.
        """
        sql = (
            "SELECT id, aggregate_id, device_id, stream, interval_start, interval_s, count,"
            " channels, max_score, windows, alert_count, uploaded_at FROM aggregates WHERE 1 = 1"
        )
        params: list[object] = []
        if stream is not None:
            sql += " AND stream = ?"
            params.append(stream)
        if since is not None:
            sql += " AND interval_start >= ?"
            params.append(since)
        sql += " ORDER BY interval_start, id"
        with self._use("aggregates") as conn:
            cur = conn.execute(sql, params)
            keys = [d[0] for d in cur.description]
            rows = cur.fetchall()
        out = [dict(zip(keys, r, strict=True)) for r in rows]
        for item in out:
            item["channels"] = json.loads(item["channels"])
        return out
