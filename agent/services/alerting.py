"""Alert raising: every episode event of a stream (raised, updated, cleared) becomes a stored
alert handed on to its consumers, and every closed aggregate interval a stored aggregate.

An event is planned against its stream's open episode (:mod:`agent.services.episode_book`),
numbered and stored with the episode mark in one transaction, or published while the store
writer commits it (:mod:`agent.publish.keeper`: an alert the store refuses goes over MQTT from
memory), then the state board, the snapshot
worker (a camera's raised event), the MQTT publisher, the fleet uploader and the console are
told. Runs on the pipeline (main) thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TextIO

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.pipeline.stream import AlertEvent
from agent.publish.keeper import AlertKeeper
from agent.publish.mqtt import MqttPublisher
from agent.records import Aggregate, Alert
from agent.sensor_streams import SensorStream
from agent.services.camera import CameraStream
from agent.services.episode_book import EpisodeBook
from agent.services.snapshot_service import SnapshotService
from agent.services.stream_feed import StateFeed
from agent.services.uploader import Uploader
from agent.store.parts import RepeatPolicy
from agent.store.sqlite import Store

log = logging.getLogger("agent")


class Alerting:
    """Stores the streams' episode events as alerts and their aggregates, and hands them on.

    Args:
        device_id: This agent's device id (the alert ids' first part).
        clock: Wall clock, epoch seconds UTC (``raised_at``).
        store: Holds the aggregates.
        keeper: Stores the alerts (and delivers those the store refuses from memory).
        episodes: Every stream's open episode and its next sequence numbers.
        feed: The state board's feed (episodes opened and closed).
        metrics: ``alert_events_total``, ``alerts_total``, ``dropped_total``.
        repeat: By stream: how an aggregate of an interval already stored is stored
            (:func:`agent.source_policies.repeat_policy`); unset = ``same_readings``.
        snapshots: Camera alert snapshots, or None.
        publisher: The MQTT publisher, or None.
        uploader: The fleet uploader, or None.
        console: Where each alert's console line is printed, or None.

    Attributes:
        alerts_raised: Raised events stored or delivered (not updates or clears).
        aggregates_written: Aggregates stored.
        aggregates_dropped: Aggregates the store refused (counted and logged).
    """

    def __init__(
        self,
        device_id: str,
        clock: Callable[[], float],
        store: Store,
        keeper: AlertKeeper,
        episodes: EpisodeBook,
        feed: StateFeed,
        metrics: Metrics,
        repeat: Mapping[str, RepeatPolicy],
        *,
        snapshots: SnapshotService | None = None,
        publisher: MqttPublisher | None = None,
        uploader: Uploader | None = None,
        console: TextIO | None = None,
    ) -> None:
        self.device_id = device_id
        self.clock = clock
        self.store = store
        self.keeper = keeper
        self.episodes = episodes
        self.feed = feed
        self.metrics = metrics
        self._repeat = repeat
        self.snapshots = snapshots
        self.publisher = publisher
        self.uploader = uploader
        self.console = console
        self.alerts_raised = 0
        self.aggregates_written = 0
        self.aggregates_dropped = 0

    def raise_event(self, s: SensorStream | CameraStream, event: AlertEvent) -> None:
        """Store one episode event (raised, updated, cleared) and hand it on."""
        device = self.device_id
        m = s.package.manifest
        episodic = (s.pipeline.rules.params.clear_windows > 0)
        plan = self.episodes.plan(event, episodic)
        if plan is None:
            return
        # a camera's raised event carries a snapshot of its frame (not updated / cleared)
        snaps = (self.snapshots if isinstance(s, CameraStream) and event.frame is not None
                 and event.kind == "raised" else None)

        def make(seq: int) -> Alert:
            return Alert(
                alert_id=f"{device}:{event.stream}:{seq}",
                device_id=device,
                stream=event.stream,
                seq=seq,
                model_name=m.name,
                model_version=m.version,
                score=event.score,
                threshold=event.threshold,
                window_start=event.window_start,
                window_end=event.window_end,
                raised_at=self.clock(),
                top_channels=event.top_channels,
                origin=event.origin,
                explanation=event.explanation,
                event=event.kind,
                episode_id=plan.episode_id,
                peak_score=event.peak_score,
                reason=event.reason,
                snapshot=(None if snaps is None
                          else snaps.ref(event.stream, f"{device}:{event.stream}:{seq}")),
            )

        # A refused alert goes over MQTT from memory (or is counted lost): agent.publish.keeper.
        alert, stored = self.keeper.add(event.stream, make, plan.mark, plan.seq,
                                        received_mono=event.received_mono or None)
        if alert is None:
            return
        self.episodes.stored(event, alert.alert_id, plan)
        if plan.mark.open or plan.mark.close:
            self.feed.episode(event.stream, self.episodes.open.get(event.stream))
        self.metrics.alert_events_total.labels(stream=event.stream, event=event.kind).inc()
        if event.kind == "raised":
            self.alerts_raised += 1
            self.metrics.alerts_total.labels(stream=event.stream).inc()
        if snaps is not None and isinstance(s, CameraStream):
            snaps.submit(alert, event, s)
        if self.publisher is not None:
            self.publisher.notify(alert.alert_id)  # tracked by the keeper
        if self.uploader is not None and stored:
            self.uploader.notify()
        if self.console is not None:
            print(alert.console_line(), file=self.console, flush=True)

    def write_aggregate(self, agg: Aggregate) -> None:
        """Store one aggregate (a refusal is counted and logged, never raised)."""
        try:
            self.store.add_aggregate(agg, self._repeat.get(agg.stream, "same_readings"))
            self.aggregates_written += 1
        except StoreError as exc:
            self.aggregates_dropped += 1
            self.metrics.dropped_total.labels(kind="aggregate", reason="store_error").inc()
            log.error("stream %s: aggregate not stored: %s", agg.stream, exc,
                      extra={"stream": agg.stream})
            return
        self.keeper.persist_seq()
