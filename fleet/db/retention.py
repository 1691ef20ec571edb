"""Age-based retention of model status reports (``model_status_reports``).

Every :class:`~cloud_sync.protocol.ModelStatusReport` a device sends is one row; without
pruning the table grows for as long as the fleet runs. :class:`StatusRetention` deletes the rows
received more than ``max_age_s`` ago. It is called after each stored report and does the work at
most once per ``every_s`` per process (one ``DELETE ... WHERE received_at < cutoff``), so a fleet
that receives reports prunes them hourly, with no background thread and with any number of
worker processes (each prunes at most hourly; the deletes are idempotent). The per-device state
of a rollout lives in ``rollout_devices`` and is never pruned.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable

from sqlalchemy import Engine, delete

from fleet.db.model_tables import model_status_reports

#: Default age after which a status report is deleted (days).
DEFAULT_STATUS_RETENTION_DAYS = 90.0
#: How often one process prunes at most (seconds).
PRUNE_EVERY_S = 3600.0

_log = logging.getLogger(__name__)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class StatusRetention:
    """Deletes status reports older than ``max_age_s``, at most once per ``every_s``.

    Args:
        engine: The fleet database.
        max_age_s: Age (by ``received_at``) past which a report is deleted, seconds (> 0).
        every_s: Least time between two prunes of this instance, seconds.
        clock: Wall clock (aware UTC).

    Raises:
        ValueError: ``max_age_s`` is not positive.
    """

    def __init__(
        self,
        engine: Engine,
        max_age_s: float,
        *,
        every_s: float = PRUNE_EVERY_S,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        if not max_age_s > 0:
            raise ValueError("max_age_s must be positive")
        self._engine = engine
        self.max_age_s = max_age_s
        self.every_s = every_s
        self._clock = clock
        self._last: dt.datetime | None = None
        self._lock = threading.Lock()

    def prune(self) -> int:
        """Delete every report older than ``max_age_s`` now; returns the rows deleted."""
        cutoff = self._clock() - dt.timedelta(seconds=self.max_age_s)
        with self._engine.begin() as conn:
            deleted = conn.execute(
                delete(model_status_reports).where(model_status_reports.c.received_at < cutoff)
            ).rowcount
        if deleted:
            _log.info("deleted %d model status report(s) received before %s", deleted,
                      cutoff.isoformat(timespec="seconds"))
        return int(deleted or 0)

    def maybe_prune(self) -> int:
        """:meth:`prune` when the last prune of this instance is ``every_s`` old (or none yet)."""
        now = self._clock()
        with self._lock:
            if self._last is not None and (now - self._last).total_seconds() < self.every_s:
                return 0
            self._last = now
        return self.prune()
