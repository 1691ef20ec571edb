"""Upload camera alert snapshots to the fleet, after their alert (``[snapshots] upload``).

One thread (``fleet-snapshots``) loops: read the oldest snapshots whose alert the fleet has
acknowledged (:meth:`agent.store.sqlite.Store.snapshots_to_upload`: the fleet stores a snapshot
only beside its alert) and ``PUT`` each image to
``/v1/devices/{device_id}/alerts/{alert_id}/snapshot`` (JPEG) and ``.../heatmap`` (PNG)
(:meth:`cloud_sync.client.FleetClient.put_snapshot`). The alert never waits for this: it went
through ``/v1/ingest`` already, its body without the payload's ``snapshot`` key.

Answers:

* 2xx for every image: the snapshot is marked ``uploaded``
  (``snapshot_uploads_total{status="uploaded"}``);
* 404 or 405 (a fleet older than snapshots has no such route), or any other 4xx (the fleet
  refused the image: too large, not a valid JPEG/PNG): marked ``refused: HTTP <status>``, kept in
  the store, never retried (``{status="refused"}``), logged once per status a minute. After a
  404/405 the uploader also waits :data:`UNSUPPORTED_WAIT_S` before trying the next snapshot, so
  an old fleet costs one request an hour;
* unreachable, 5xx, 429 or 401/403: tried again after a backoff doubling from the poll interval
  up to :data:`BACKOFF_MAX_S` (``{status="failed"}``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from agent.errors import StoreError
from agent.logs import RateLimiter
from agent.metrics import Metrics
from agent.store.snapshots import Snapshot
from agent.store.sqlite import Store
from cloud_sync.errors import FleetError, FleetRejected

log = logging.getLogger("agent.uploader")

#: Wait after a fleet answered that it has no snapshot route (404/405), seconds.
UNSUPPORTED_WAIT_S = 3600.0
#: Longest backoff after a failed upload, seconds.
BACKOFF_MAX_S = 300.0
#: Snapshots read per pass.
BATCH = 8


class SnapshotClient(Protocol):
    """What the uploader needs of :class:`cloud_sync.client.FleetClient`."""

    def put_snapshot(self, device_id: str, alert_id: str, kind: str, data: bytes) -> None: ...


class SnapshotUploader:
    """Uploads snapshots (module docstring).

    Args:
        store: Holds the snapshots and their upload states.
        client: The fleet client.
        device_id: This device's id.
        metrics: ``snapshot_uploads_total{status}``.
        poll_s: Seconds between passes when idle. clock: Wall clock (``uploaded_at``).
        monotonic: Monotonic clock (log rate limit).
    """

    def __init__(self, store: Store, client: SnapshotClient, device_id: str, metrics: Metrics,
                 *, poll_s: float = 5.0, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._client = client
        self._device = device_id
        self._metrics = metrics
        self._poll_s = poll_s
        self._clock = clock
        self._limiter = RateLimiter(60.0, monotonic)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-snapshots", daemon=True)
        self._backoff = poll_s
        self.uploaded = 0

    def notify(self) -> None:
        """A snapshot was stored or an alert acknowledged: look now (never cuts a backoff)."""
        self._wake.set()

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """End the thread (snapshots not uploaded stay in the store)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.run_once()
            except StoreError as exc:
                if self._limiter.hit("store") is not None:
                    log.warning("snapshots not uploaded: %s", exc)
                wait = self._poll_s
            except Exception:  # a bug must not end the thread
                log.exception("snapshot uploader failed")
                wait = self._poll_s
            if wait > self._poll_s:
                self._stop.wait(wait)  # a backoff: notify() does not cut it short
            else:
                self._wake.wait(wait)
                self._wake.clear()

    def run_once(self) -> float:
        """Upload what is due; returns the seconds to wait before the next pass.

        Raises:
            StoreError: the store failed.
        """
        for snap in self._store.snapshots_to_upload(BATCH):
            if self._stop.is_set():
                break
            wait = self._upload(snap)
            if wait is not None:
                return wait
        return self._poll_s

    def _upload(self, snap: Snapshot) -> float | None:
        """One snapshot; None to go on, else the wait before the next pass."""
        parts = [("snapshot", snap.jpeg)]
        if snap.heatmap is not None:
            parts.append(("heatmap", snap.heatmap))
        try:
            for kind, data in parts:
                self._client.put_snapshot(self._device, snap.alert_id, kind, data)
        except FleetRejected as exc:
            self._store.mark_snapshot_uploaded(snap.row_id, f"refused: HTTP {exc.status}", None)
            self._metrics.snapshot_uploads_total.labels(status="refused").inc()
            unsupported = exc.status in (404, 405)
            if self._limiter.hit(("refused", exc.status)) is not None:
                log.warning("fleet refused the snapshot of alert %s (%s)%s; kept in the store",
                            snap.alert_id, exc,
                            ": it does not take snapshots (an older fleet?)" if unsupported
                            else "")
            return UNSUPPORTED_WAIT_S if unsupported else None
        except FleetError as exc:
            self._metrics.snapshot_uploads_total.labels(status="failed").inc()
            if self._limiter.hit("failed") is not None:
                log.warning("snapshot upload failed (%s); retrying in %.0f s", exc,
                            self._backoff)
            wait = self._backoff
            self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)
            return wait
        self._backoff = self._poll_s
        self._store.mark_snapshot_uploaded(snap.row_id, "uploaded", self._clock())
        self._metrics.snapshot_uploads_total.labels(status="uploaded").inc()
        self.uploaded += 1
        return None
