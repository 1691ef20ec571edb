"""The snapshot parts of the agent in one place: worker, MQTT publisher and fleet uploader.

:func:`build_snapshots` is what the composition root (:mod:`agent.app`) calls: None when no
stream is a camera or ``[snapshots] enabled = false``; else a :class:`SnapshotService` with the
:class:`agent.services.snapshots.SnapshotWorker` (always), the
:class:`agent.publish.snapshots.SnapshotPublisher` (``publish`` and ``[mqtt]`` enabled) and the
:class:`agent.services.snapshot_upload.SnapshotUploader` (``upload`` and ``[fleet]`` enabled).
User documentation: ``docs/snapshots.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.errors import StoreError
from agent.publish.snapshots import SnapshotPublisher, snapshot_topics
from agent.records import Alert, SnapshotRef
from agent.services.snapshot_upload import SnapshotClient, SnapshotUploader
from agent.services.snapshots import SnapshotJob, SnapshotWorker

if TYPE_CHECKING:
    from agent.config.schema import AgentConfig
    from agent.metrics import Metrics
    from agent.pipeline.stream import AlertEvent
    from agent.publish.mqtt import MqttPublisher
    from agent.services.camera import CameraStream
    from agent.store.sqlite import Store

log = logging.getLogger("agent.snapshots")


class SnapshotService:
    """Worker, publisher and uploader of camera alert snapshots (module docstring).

    Args:
        worker: Renders and stores snapshots.
        publisher: Publishes them on retained topics (None: not published).
        uploader: Uploads them to the fleet (None: not uploaded).
        topic_prefix: ``<prefix>/<device_id>`` topics for the alert payload's ``snapshot``
            (None without MQTT publishing).
        device_id: The gateway's id.
    """

    def __init__(self, worker: SnapshotWorker, publisher: SnapshotPublisher | None,
                 uploader: SnapshotUploader | None, topic_prefix: str | None,
                 device_id: str) -> None:
        self.worker = worker
        self.publisher = publisher
        self.uploader = uploader
        self._prefix = topic_prefix
        self._device = device_id
        if publisher is not None:
            worker.on_stored(publisher.notify)
        if uploader is not None:
            worker.on_stored(uploader.notify)

    def ref(self, stream: str, alert_id: str) -> SnapshotRef:
        """What the alert payload's ``snapshot`` names for an alert of ``stream``."""
        if self._prefix is None:
            return SnapshotRef(alert_id)
        jpeg, png = snapshot_topics(self._prefix, self._device, stream)
        return SnapshotRef(alert_id, jpeg, png if self.worker.config.heatmap else None)

    def submit(self, alert: Alert, event: AlertEvent, camera: CameraStream) -> bool:
        """Queue the snapshot of a stored camera alert (False: no frame, or the queue is
        full)."""
        if event.frame is None:
            return False
        return self.worker.submit(SnapshotJob(alert, event.frame, camera.package,
                                              camera.pipeline.spec,
                                              finite=camera.source.config.finite,
                                              runtime=camera.pipeline.backend.name))

    def start(self) -> None:
        """Start every part's thread."""
        self.worker.start()
        if self.publisher is not None:
            self.publisher.start()
        if self.uploader is not None:
            self.uploader.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Finish the queued snapshots, publish the latest ones once more, end the threads
        (before the MQTT publisher stops)."""
        self.worker.stop(timeout_s)
        if self.publisher is not None:
            self.publisher.stop()
            try:
                self.publisher.run_once()
            except StoreError as exc:
                log.warning("snapshots not published at shutdown: %s", exc)
        if self.uploader is not None:
            self.uploader.stop()


def build_snapshots(config: AgentConfig, store: Store, publisher: MqttPublisher | None,
                    metrics: Metrics, clock: Callable[[], float] = time.time,
                    ) -> SnapshotService | None:
    """The snapshot service for ``config`` (None when no camera stream or disabled)."""
    sc = config.snapshots
    if not sc.enabled or not any(s.source.kind == "camera" for s in config.streams):
        return None
    device = config.agent.device_id
    worker = SnapshotWorker(sc, store, metrics)
    pub = None
    prefix = None
    if sc.publish and publisher is not None and config.mqtt.enabled:
        pub = SnapshotPublisher(publisher, store, device, metrics, clock=clock)
        prefix = config.mqtt.topic_prefix
    up = None
    if sc.upload and config.fleet.enabled:
        up = SnapshotUploader(store, _fleet_client(config, clock), device, metrics, clock=clock)
    return SnapshotService(worker, pub, up, prefix, device)


def _fleet_client(config: AgentConfig, clock: Callable[[], float]) -> SnapshotClient:
    """A fleet client of its own (its own HTTP session) for the snapshot uploads."""
    from agent.services.fleet_transport import session_for  # noqa: PLC0415
    from agent.services.uploader import read_token  # noqa: PLC0415
    from cloud_sync.client import FleetClient  # noqa: PLC0415 - requests only when enabled

    fc = config.fleet
    assert fc.url is not None
    return FleetClient(fc.url, read_token(fc), session_for(fc),
                       connect_timeout_s=fc.connect_timeout_s,
                       read_timeout_s=fc.read_timeout_s, clock=clock)
