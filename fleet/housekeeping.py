"""The fleet's background work in each serving process: offline sweep, retention, webhooks.

:class:`Housekeeper` runs one thread (``fleet-housekeeping``) that every
``Settings.housekeeping_s`` marks silent devices offline (queuing their ``device_offline``
webhook events in the same transaction, :meth:`fleet.db.health.HealthStore.sweep`) and, at most
hourly, applies the retention ages (:class:`fleet.db.retention.Retention`) and creates the
time partitions ahead on PostgreSQL (:class:`fleet.db.partitions.PartitionMaintainer`, also once
right after start); and the webhook
:class:`fleet.notify.Dispatcher`. Every worker process runs its own: the sweep and the deletes
are idempotent and a delivery is leased to one process, so N workers do the work once.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from fleet.db.health import HealthStore
from fleet.db.partitions import PartitionMaintainer
from fleet.db.retention import DEFAULT_RETENTION_S, Retention
from fleet.db.webhooks import WebhookStore
from fleet.events import Events
from fleet.metrics import FleetMetrics
from fleet.notify import Dispatcher, RetryPolicy
from fleet.settings import Settings

_log = logging.getLogger(__name__)


def retention_for(settings: Settings, engine: Engine) -> Retention:
    """The retention of ``settings`` (defaults, the status-report days, then ``--retention``)."""
    ages = dict(DEFAULT_RETENTION_S)
    ages["status_reports"] = settings.status_retention_days * 86400
    ages.update(settings.retention_s)
    return Retention(engine, ages)


class Housekeeper:
    """Starts and stops the background work of one serving process.

    Args:
        settings: Intervals, ages, webhook policy.
        health: Device health (the offline sweep).
        webhooks: The delivery queue.
        retention: Table ages.
        metrics: Delivery outcomes are counted here.
        partitions: Creates time partitions ahead (None: nothing to maintain).
    """

    def __init__(self, settings: Settings, health: HealthStore, webhooks: WebhookStore,
                 retention: Retention, metrics: FleetMetrics,
                 partitions: PartitionMaintainer | None = None) -> None:
        self.settings = settings
        self.partitions = partitions
        self.health = health
        self.webhooks = webhooks
        self.retention = retention
        self.dispatcher = Dispatcher(
            webhooks,
            RetryPolicy(max_attempts=settings.webhook_max_attempts,
                        backoff_base_s=settings.webhook_backoff_base_s,
                        backoff_max_s=settings.webhook_backoff_max_s,
                        timeout_s=settings.webhook_timeout_s),
            poll_s=settings.webhook_poll_s,
            on_result=lambda event, outcome: metrics.webhook_deliveries.labels(
                event, outcome).inc(),
        )
        self.events = Events(webhooks, wake=self.dispatcher.wake)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.dispatcher.start()
        self._thread = threading.Thread(target=self._run, name="fleet-housekeeping",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.dispatcher.stop(timeout)
        if self._thread is not None:
            self._thread.join(timeout)

    def sweep_once(self) -> list[str]:
        """Mark silent devices offline and queue their events; returns the ids."""
        queued = [0]

        def offline(conn: Connection, device_id: str, last: dt.datetime) -> None:
            queued[0] += self.webhooks.enqueue("device_offline", {
                "device_id": device_id,
                "last_contact": last.isoformat().replace("+00:00", "Z"),
                "offline_after_s": self.health.offline_after_s,
            }, conn)

        gone = self.health.sweep(offline)
        if gone:
            _log.info("device(s) offline (silent over %.0f s): %s", self.health.offline_after_s,
                      ", ".join(gone[:20]))
        self.events.queued(queued[0])
        return gone

    def _run(self) -> None:
        self._maintain()
        while not self._stop.wait(self.settings.housekeeping_s):
            try:
                self.sweep_once()
                self.retention.maybe_run()
                self._maintain()
            except SQLAlchemyError as exc:  # the database is down: try again next period
                _log.warning("housekeeping failed (next try in %.0f s): %s",
                             self.settings.housekeeping_s, exc)
            except Exception:
                _log.exception("housekeeping failed unexpectedly")

    def _maintain(self) -> None:
        if self.partitions is None:
            return
        try:
            self.partitions.maybe_run()
        except SQLAlchemyError as exc:  # lock timeout or database down: next period
            _log.warning("partition maintenance failed (next try in %.0f s): %s",
                         self.settings.housekeeping_s, exc)
