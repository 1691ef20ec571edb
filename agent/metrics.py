"""Every Prometheus metric the agent exports, in one place.

Components receive a :class:`Metrics` instance through their constructor (tests pass one built on
a fresh ``CollectorRegistry``). Names follow Prometheus conventions: ``_total`` for counters,
base units (seconds, bytes) in the name.
"""

from __future__ import annotations

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

# Buckets in seconds for one HTTP upload (a batch of up to 5,000 records).
UPLOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# Buckets in seconds for sub-millisecond to 100 ms latencies.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.08, 0.1, 0.25, 1.0,
)


class Metrics:
    """The agent's metrics, registered on ``registry``.

    Args:
        registry: Where to register; a fresh ``CollectorRegistry()`` per agent (and per test).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # process_* (RSS, CPU seconds, open fds, start time) and python_info on this registry
        # (prometheus_client's global REGISTRY has them already).
        if r is not REGISTRY:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
        self.info = Info("edge_agent", "Agent build information.", registry=r)
        # sources
        self.readings_total = Counter(
            "edge_agent_readings_total", "Readings accepted.", ["stream"], registry=r
        )
        self.records_rejected_total = Counter(
            "edge_agent_records_rejected_total",
            "Input records rejected, by reason.",
            ["stream", "reason"],
            registry=r,
        )
        self.source_errors_total = Counter(
            "edge_agent_source_errors_total",
            "Source failures (port gone, file missing) that triggered a retry.",
            ["stream"],
            registry=r,
        )
        self.source_outages_total = Counter(
            "edge_agent_source_outages_total",
            "Source outages (a lost connection or a failed start, however many retries it "
            "took), counted when each begins.",
            ["stream"], registry=r,
        )
        self.source_outage_seconds_total = Counter(
            "edge_agent_source_outage_seconds_total",
            "Seconds the source was down (from its first failure to its recovery), added when "
            "each outage ends (or the stream stops).",
            ["stream"], registry=r,
        )
        self.source_up = Gauge(
            "edge_agent_source_up", "1 while the source is reading.", ["stream"], registry=r
        )
        # polled sources (agent.sources.modbus): poll timing, counted by the source itself
        self.poll_jitter_seconds = Histogram(
            "edge_agent_poll_jitter_seconds",
            "How late each poll started after its due time (poll_interval_s grid).",
            ["stream"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.poll_duration_seconds = Histogram(
            "edge_agent_poll_duration_seconds",
            "From a poll's first request to its last response.",
            ["stream"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.poll_overruns_total = Counter(
            "edge_agent_poll_overruns_total",
            "Polls that took longer than the poll interval.", ["stream"], registry=r,
        )
        self.polls_missed_total = Counter(
            "edge_agent_polls_missed_total",
            "Polls not made, by reason: overrun (slow polls left no time for them), "
            "unreachable (the device was down or not answering); gap (MQTT in with "
            "expected_interval_s: readings a jump in the payload timestamps says never came).",
            ["stream", "reason"], registry=r,
        )
        # MQTT-in streams with Sparkplug B (agent.sources.mqtt_in)
        self.sparkplug_events_total = Counter(
            "edge_agent_sparkplug_events_total",
            "Sparkplug B events of MQTT-in streams: seq_gap (messages lost, counted by the "
            "gap), bdseq_change (the edge node began a new session), unknown_alias, "
            "data_before_birth, rebirth_requested.",
            ["stream", "event"], registry=r,
        )
        # camera streams (agent.services.camera; synced from the source at each heartbeat)
        self.camera_frames_scored_total = Counter(
            "edge_agent_camera_frames_scored_total", "Camera frames scored by the model.",
            ["stream"], registry=r,
        )
        self.camera_frames_dropped_total = Counter(
            "edge_agent_camera_frames_dropped_total",
            "Camera frames read but not scored, by reason: newer_frame (replaced by a newer "
            "one before the model took it: live cameras and files at fps > 0 keep only the "
            "newest frame), score_error (the model failed on it), stopped (queued when the "
            "stream stopped, or read by a capture being replaced).",
            ["stream", "reason"], registry=r,
        )
        self.camera_reconnects_total = Counter(
            "edge_agent_camera_reconnects_total",
            "Camera captures reopened after a stall, a failed read or a failed open.",
            ["stream"], registry=r,
        )
        self.camera_stalls_total = Counter(
            "edge_agent_camera_stalls_total",
            "Camera frame-age watchdog firings (no new frame for the source's stall_s).",
            ["stream"], registry=r,
        )
        self.camera_frame_age_seconds = Gauge(
            "edge_agent_camera_frame_age_seconds",
            "Seconds since the newest camera frame was captured, as of the last heartbeat.",
            ["stream"], registry=r,
        )
        # pipeline
        self.windows_total = Counter(
            "edge_agent_windows_total", "Windows scored.", ["stream"], registry=r
        )
        self.alerts_total = Counter(
            "edge_agent_alerts_total", "Alerts raised.", ["stream"], registry=r
        )
        self.calibration_outliers_total = Counter(
            "edge_agent_calibration_outliers_total",
            "Far-out readings left out of a calibration fit.", ["stream"], registry=r,
        )
        self.nonfinite_scores_total = Counter(
            "edge_agent_nonfinite_scores_total",
            "Windows whose score was not finite (scored off-scale, so they can alert).",
            ["stream"], registry=r,
        )
        self.clock_steps_total = Counter(
            "edge_agent_clock_steps_total",
            "Steps of a stream's timestamps against the monotonic clock, by direction.",
            ["stream", "direction"], registry=r,
        )
        self.inference_seconds = Histogram(
            "edge_agent_inference_seconds",
            "Model inference time per window.",
            ["stream", "backend"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.read_to_score_seconds = Histogram(
            "edge_agent_read_to_score_seconds",
            "From receipt of a window's newest reading to its score.",
            ["stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.read_to_alert_seconds = Histogram(
            "edge_agent_read_to_alert_seconds",
            "From receipt of the newest reading of an alert's window to the broker's PUBACK.",
            ["stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.calibrating = Gauge(
            "edge_agent_calibrating",
            "1 while the stream is in its calibration period.",
            ["stream"],
            registry=r,
        )
        self.threshold = Gauge(
            "edge_agent_threshold", "Score threshold in force.", ["stream"], registry=r
        )
        # per stream, for plotting score against threshold (agent.services.stream_feed)
        self.stream_score = Gauge(
            "edge_agent_stream_score",
            "The last scored window's score (model units; not set before the first).",
            ["stream"], registry=r,
        )
        self.stream_threshold = Gauge(
            "edge_agent_stream_threshold",
            "The threshold in force, model units (not set while calibrating).",
            ["stream"], registry=r,
        )
        self.stream_anomaly_active = Gauge(
            "edge_agent_stream_anomaly_active",
            "1 while an alert episode of the stream is open (raised, not yet cleared).",
            ["stream"], registry=r,
        )
        self.alert_events_total = Counter(
            "edge_agent_alert_events_total",
            "Episode events stored in the outbox, by event (raised, updated, cleared).",
            ["stream", "event"], registry=r,
        )
        self.mqtt_state_total = Counter(
            "edge_agent_mqtt_state_total",
            "Retained stream-state messages: published, retain_refused (the broker takes no "
            "retained messages: sent without retain), skipped (not connected).",
            ["result"], registry=r,
        )
        self.queue_depth = Gauge(
            "edge_agent_queue_depth", "Readings waiting for the pipeline.", registry=r
        )
        # liveness (agent.health): what the systemd watchdog and /healthz decide on
        self.watchdog_last_ok = Gauge(
            "edge_agent_watchdog_last_ok_timestamp_seconds",
            "Wall time (epoch s) of the last heartbeat at which every stage made progress.",
            registry=r,
        )
        self.stage_progress_age_seconds = Gauge(
            "edge_agent_stage_progress_age_seconds",
            "Seconds since a stage last made progress (stage: source:<stream>, pipeline, "
            "publisher).",
            ["stage"],
            registry=r,
        )
        self.stage_stalled = Gauge(
            "edge_agent_stage_stalled",
            "1 while a stage is stalled (no progress for longer than its stall limit).",
            ["stage"],
            registry=r,
        )
        self.health_state = Gauge(
            "edge_agent_health_state",
            "Health per component: 0 green, 1 yellow, 2 red (component 'overall' = worst).",
            ["component"],
            registry=r,
        )
        self.dropped_total = Counter(
            "edge_agent_dropped_total",
            "Records dropped, by reason (never silently).",
            ["kind", "reason"],
            registry=r,
        )
        # camera alert snapshots (agent.services.snapshots, agent.publish.snapshots)
        self.snapshots_total = Counter(
            "edge_agent_snapshots_total",
            "Camera alert snapshots stored (frame JPEG, and heatmap PNG when available).",
            ["stream"],
            registry=r,
        )
        self.snapshots_published_total = Counter(
            "edge_agent_snapshots_published_total",
            "Snapshots written to the broker on the retained snapshot/heatmap topics, by "
            "retained (true, or false when the broker refuses retained messages).",
            ["retained"],
            registry=r,
        )
        self.snapshots_unpublished_total = Counter(
            "edge_agent_snapshots_unpublished_total",
            "Snapshots kept in the store but not published, by reason: oversize (over "
            "mqtt.max_message_bytes or the broker's Maximum Packet Size), failed (the "
            "connection was lost at three attempts).",
            ["reason"],
            registry=r,
        )
        self.snapshot_uploads_total = Counter(
            "edge_agent_snapshot_uploads_total",
            "Snapshot uploads to the fleet, by status: uploaded, refused (the fleet said no: "
            "kept in the store, not retried), failed (retried).",
            ["status"],
            registry=r,
        )
        # store and publish
        self.outbox_depth = Gauge(
            "edge_agent_outbox_depth", "Alerts waiting for a PUBACK.", registry=r
        )
        self.outbox_oldest_age_seconds = Gauge(
            "edge_agent_outbox_oldest_age_seconds",
            "Age of the oldest alert waiting for a PUBACK.",
            registry=r,
        )
        self.store_errors_total = Counter(
            "edge_agent_store_errors_total", "SQLite write failures.", ["op"], registry=r
        )
        self.aggregates_total = Counter(
            "edge_agent_aggregates_total", "Aggregates written.", ["stream"], registry=r
        )
        self.mqtt_connected = Gauge(
            "edge_agent_mqtt_connected", "1 while connected to the broker.", registry=r
        )
        self.mqtt_published_total = Counter(
            "edge_agent_mqtt_published_total", "Alerts acknowledged by the broker.", registry=r
        )
        self.mqtt_disconnects_total = Counter(
            "edge_agent_mqtt_disconnects_total", "Broker connection losses.", registry=r
        )
        self.mqtt_stalls_total = Counter(
            "edge_agent_mqtt_stalls_total",
            "Connections dropped and rebuilt because no PUBACK came for alerts in flight.",
            registry=r,
        )
        self.mqtt_rejected_total = Counter(
            "edge_agent_mqtt_rejected_total",
            "PUBACKs with a failure reason code (MQTT 5), by reason.",
            ["reason"],
            registry=r,
        )
        # MQTT consumers (agent.publish.homeassistant, agent.publish.sparkplug_edge)
        self.ha_discovery_total = Counter(
            "edge_agent_ha_discovery_total",
            "Home Assistant discovery: config messages published, removed, and birth "
            "messages of Home Assistant answered, by action.",
            ["action"], registry=r,
        )
        self.sparkplug_connected = Gauge(
            "edge_agent_sparkplug_connected", "1 while the Sparkplug B connection is up.",
            registry=r,
        )
        self.sparkplug_messages_total = Counter(
            "edge_agent_sparkplug_messages_total",
            "Sparkplug B messages the edge node published, by kind (NBIRTH, DBIRTH, DDATA, "
            "DDEATH, NDEATH).",
            ["kind"], registry=r,
        )
        self.sparkplug_commands_total = Counter(
            "edge_agent_sparkplug_commands_total",
            "Sparkplug B NCMD messages received, by result (rebirth, ignored, rejected).",
            ["result"], registry=r,
        )
        self.mqtt_oversize_total = Counter(
            "edge_agent_mqtt_oversize_total",
            "Alerts over the broker's size limit: sent reduced or dead-lettered.",
            ["action"],
            registry=r,
        )
        self.model_info = Info(
            "edge_agent_model", "Active model per stream.", ["stream"], registry=r
        )
        self.store_bytes = Gauge(
            "edge_agent_store_bytes",
            "Live bytes of the SQLite store (used pages plus WAL), as of the last budget check.",
            registry=r,
        )
        self.disk_bytes = Gauge(
            "edge_agent_disk_bytes",
            "Bytes on disk per part of the one disk budget (agent.disk_budget): store, models, "
            "openvino_cache, snapshots; as of the last check.",
            ["part"],
            registry=r,
        )
        self.disk_budget_bytes = Gauge(
            "edge_agent_disk_budget_bytes",
            "The disk budget across every part (storage.disk_budget_bytes); 0 = none set.",
            registry=r,
        )
        self.disk_evicted_bytes_total = Counter(
            "edge_agent_disk_evicted_bytes_total",
            "Bytes deleted to keep the disk budget, per part (the store's rows are counted "
            "in edge_agent_dropped_total{reason=\"budget\"}).",
            ["part"],
            registry=r,
        )
        self.store_quarantined_total = Counter(
            "edge_agent_store_quarantined_total",
            "Corrupt store files renamed aside at start (the agent started on a fresh store).",
            registry=r,
        )
        # fleet upload
        self.upload_records_total = Counter(
            "edge_agent_upload_records_total",
            "Records the fleet answered for, by status (accepted, duplicate, rejected).",
            ["kind", "status"],
            registry=r,
        )
        self.upload_failures_total = Counter(
            "edge_agent_upload_failures_total",
            "Upload attempts that failed, by reason (unavailable, auth, rejected, protocol, "
            "store).",
            ["reason"],
            registry=r,
        )
        self.upload_backlog = Gauge(
            "edge_agent_upload_backlog",
            "Records stored but not yet acknowledged by the fleet.",
            ["kind"],
            registry=r,
        )
        self.sync_lag_seconds = Gauge(
            "edge_agent_sync_lag_seconds",
            "Age of the oldest record not yet acknowledged by the fleet (0 when none).",
            registry=r,
        )
        self.upload_seconds = Histogram(
            "edge_agent_upload_seconds",
            "Duration of one ingest request (successful or not).",
            buckets=UPLOAD_BUCKETS,
            registry=r,
        )
        # model updates (agent.services.updater)
        self.model_updates_total = Counter(
            "edge_agent_model_updates_total",
            "Model update steps by state (downloaded, verified, accepted, shadow, active, "
            "rejected, rolled_back).",
            ["stream", "state"],
            registry=r,
        )
        self.model_version = Gauge(
            "edge_agent_model_version", "Version of the model in force.", ["stream"], registry=r
        )
        self.shadow_windows = Gauge(
            "edge_agent_shadow_windows",
            "Windows scored so far by the candidate of the shadow run in progress (0 when none).",
            ["stream"],
            registry=r,
        )
        # inference runtimes (agent.inference.select) and the latency budget (.deadline)
        self.backend_selected = Gauge(
            "edge_agent_backend_selected",
            "1 for the backend/precision chosen for the stream at model activation, 0 for the "
            "others that were tried.",
            ["stream", "backend", "precision"],
            registry=r,
        )
        self.backend_benchmark_seconds = Gauge(
            "edge_agent_backend_benchmark_seconds",
            "p50 seconds of one single-window inference measured at model activation.",
            ["stream", "backend", "precision"],
            registry=r,
        )
        self.deadline_miss_total = Counter(
            "edge_agent_deadline_miss_total",
            "Windows whose inference took longer than the package's latency_budget_ms_p99.",
            ["stream"],
            registry=r,
        )
        self.degraded = Gauge(
            "edge_agent_degraded",
            "1 while a degrade level is in force (level: skip_windows, fallback_backend) after "
            "a sustained latency budget breach.",
            ["stream", "level"],
            registry=r,
        )
