"""The ``episodes`` table (schema version 6): each stream's open alert episode.

One row per stream whose episode was ``raised`` and not yet ``cleared``
(:mod:`agent.pipeline.episodes`): the episode id (the ``raised`` event's ``alert_id``), its peak
score so far, the stream time (epoch s) of its last report and when it opened. The row is written
in the same transaction as the event that changes it (:class:`EpisodeMark`), so after a crash or
restart the store's outbox and its open episodes agree: an episode whose ``raised`` is stored is
open until a stored ``cleared`` closes it, and the next agent continues it
(:meth:`agent.pipeline.episodes.Lifecycle.resume`) and clears it. Functions over a connection the
:class:`~agent.store.sqlite.Store` holds (its lock, transaction and error mapping).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from agent.records import Alert

_OPEN = ("INSERT OR REPLACE INTO episodes (stream, episode_id, peak_score, reported_ts,"
         " opened_at) VALUES (?, ?, ?, ?, ?)")
_UPDATE = "UPDATE episodes SET peak_score = ?, reported_ts = ? WHERE stream = ? AND episode_id = ?"
_CLOSE = "DELETE FROM episodes WHERE stream = ? AND episode_id = ?"
_LOAD = "SELECT stream, episode_id, peak_score, reported_ts, opened_at FROM episodes"


@dataclass(frozen=True, slots=True)
class OpenEpisode:
    """A stored open episode.

    Attributes:
        stream: Stream name.
        episode_id: The ``alert_id`` of its ``raised`` event.
        peak_score: Its largest score so far (model units).
        reported_ts: Stream time (epoch s) of its last ``raised``/``updated`` event.
        opened_at: When it was raised, epoch s UTC.
    """

    stream: str
    episode_id: str
    peak_score: float
    reported_ts: float
    opened_at: float


@dataclass(frozen=True, slots=True)
class EpisodeMark:
    """What an event does to its stream's open episode, stored with the event.

    Attributes:
        open: ``raised`` of an episode that stays open (rules with ``clear_windows > 0``).
        close: ``cleared``.
        peak_score: The peak after the event.
        reported_ts: The event's stream time (epoch s), for ``raised``/``updated``.
    """

    open: bool = False
    close: bool = False
    peak_score: float = 0.0
    reported_ts: float = 0.0


def apply(conn: sqlite3.Connection, alert: Alert, mark: EpisodeMark, at: float) -> None:
    """Write ``mark`` for ``alert`` (call inside the transaction that stores ``alert``)."""
    episode = alert.episode_id or alert.alert_id
    if mark.open:
        conn.execute(_OPEN, (alert.stream, episode, float(mark.peak_score),
                             float(mark.reported_ts), float(at)))
    elif mark.close:
        conn.execute(_CLOSE, (alert.stream, episode))
    else:
        conn.execute(_UPDATE, (float(mark.peak_score), float(mark.reported_ts), alert.stream,
                               episode))


def load(conn: sqlite3.Connection) -> dict[str, OpenEpisode]:
    """Every open episode, by stream."""
    return {r[0]: OpenEpisode(r[0], r[1], float(r[2]), float(r[3]), float(r[4]))
            for r in conn.execute(_LOAD)}


def forget(conn: sqlite3.Connection, stream: str) -> None:
    """Delete ``stream``'s open episode (it left the config)."""
    conn.execute("DELETE FROM episodes WHERE stream = ?", (stream,))
