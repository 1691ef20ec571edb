"""An anomaly episode's lifecycle: ``raised``, optionally ``updated``, then ``cleared``.

The alert rules (:mod:`agent.pipeline.rules`) decide when an episode starts (debounce, cooldown)
and when it ends (hysteresis). :class:`Lifecycle` turns that into the events consumers see, the
convention of Frigate's MQTT ``events`` (``new`` / ``update`` / ``end``):

* ``raised``: the rules raised an alert (the episode's first event; its id is the episode id);
* ``updated``: while the episode is open, its peak score rose to at least ``update_ratio`` times
  the peak last reported, and ``update_interval_s`` (stream time) passed since the last report;
  ``update_ratio = 0`` never updates;
* ``cleared``: the hysteresis ended an episode that was raised.

An episode the cooldown kept from raising has no events at all (nothing was raised, so nothing is
cleared). With ``clear_windows = 0`` (e.g. an image folder, every image a different part) the
rules have no episodes: every alert is a ``raised`` event and nothing follows it.

Pure code: the caller gives the ids and persists open episodes (:meth:`Lifecycle.resume` after a
restart).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.pipeline.rules import AlertRules

Transition = Literal["raised", "updated", "cleared"]


@dataclass(frozen=True, slots=True)
class UpdateParams:
    """When an open episode reports a higher peak.

    Attributes:
        update_ratio: The new peak must be at least this many times the peak last reported
            (> 1), or 0 for no ``updated`` events.
        update_interval_s: At least this many seconds of stream time between two reports of one
            episode (the ``raised`` event counts as a report).
    """

    update_ratio: float = 1.5
    update_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.update_ratio != 0 and self.update_ratio <= 1:
            raise ValueError(f"update_ratio must be 0 or > 1, got {self.update_ratio}")
        if self.update_interval_s < 0:
            raise ValueError("update_interval_s must be >= 0")


class Lifecycle:
    """One stream's open episode (at most one) and its reports.

    >>> from agent.pipeline.rules import RuleParams
    >>> rules = AlertRules(RuleParams(k=1, n=1, clear_ratio=0.5, clear_windows=2, cooldown_s=0))
    >>> life = Lifecycle(rules, UpdateParams(update_ratio=2.0, update_interval_s=0))
    >>> [life.step(s, 1.0, t) for t, s in enumerate([2, 3, 5, 0.1, 0.1, 0.1])]
    ['raised', None, 'updated', None, 'cleared', None]
    """

    def __init__(self, rules: AlertRules, params: UpdateParams | None = None) -> None:
        self.rules = rules
        self.params = params if params is not None else UpdateParams()
        #: An episode was raised and has not been cleared yet.
        self.open = False
        #: The open episode's largest score.
        self.peak = 0.0
        self._reported = 0.0  # the peak last reported (raised or updated)
        self._reported_ts = 0.0

    def step(self, score: float, threshold: float, ts: float, stride: int = 1) -> Transition | None:
        """Feed one scored window (as :meth:`AlertRules.update`); return the event it makes.

        Args:
            score: The window's score.
            threshold: Threshold in force (NaN while calibrating).
            ts: The window's end, epoch seconds (stream time, as the rules get it).
            stride: Windows this score stands for (see :meth:`AlertRules.update`).
        """
        raised = self.rules.update(score, threshold, ts, stride)
        if raised:
            # clear_windows = 0: no episode opens, every alert stands alone
            self.open = self.rules.active
            self.peak = self._reported = score
            self._reported_ts = ts
            return "raised"
        if not self.open:
            return None
        self.peak = max(self.peak, score)
        if self.rules.ended:
            self.open = False
            return "cleared"
        p = self.params
        if (p.update_ratio > 0 and self.peak >= p.update_ratio * self._reported
                and ts - self._reported_ts >= p.update_interval_s):
            self._reported, self._reported_ts = self.peak, ts
            return "updated"
        return None

    def end(self) -> bool:
        """The input ended (a recorded file read to its end): close the open episode without
        the hysteresis; True when one was open (the caller sends its ``cleared``)."""
        if not self.open:
            return False
        self.open = False
        self.rules.active = False
        return True

    def resume(self, peak: float, reported_ts: float) -> None:
        """Continue an episode that was open before a restart (its stored peak and the stream
        time of its last report); a no-op when the rules have no episodes."""
        self.rules.resume()
        if self.rules.active:
            self.open = True
            self.peak = self._reported = peak
            self._reported_ts = reported_ts
