"""Builders of the agent's optional components from the config: the fleet uploader, the model
updater, the retraining sample uploader, the fleet health reporter, the Sparkplug B edge node
and the updater's model store. The composition root (:class:`agent.app.Agent`) calls them;
each takes what it wires together, nothing of the agent itself.

Every fleet component gets its own :class:`cloud_sync.client.FleetClient` (a slow request of
one never holds another's connection); ``requests`` and ``protobuf`` are imported only when
the component is enabled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agent import __version__
from agent.config.schema import AgentConfig
from agent.errors import ConfigError
from agent.health import Report
from agent.inference.base import Backend
from agent.metrics import Metrics
from agent.sensor_streams import SensorStream, TimedBackend
from agent.services.fleet_transport import session_for
from agent.services.health_reporter import HealthReporter, summarize
from agent.services.model_store import ModelStore
from agent.services.package_guard import (
    HIGH_WATER_FILE,
    HighWater,
    PackageGuard,
    load_keys_dir,
    load_rollback_policy,
)
from agent.services.samples import SampleCollector, SampleUploader, config_hash
from agent.services.updater import StreamHandle, Updater
from agent.services.uploader import Uploader, read_token
from agent.store.sqlite import Store
from cloud_sync.health import HealthSummary
from cloud_sync.package import TrustedKeys

if TYPE_CHECKING:
    from agent.publish.sparkplug_edge import SparkplugEdgeNode

Clock = Callable[[], float]


def build_uploader(
    config: AgentConfig, store: Store, metrics: Metrics, clock: Callable[[], float]
) -> Uploader:
    """The fleet client and uploader for ``config.fleet`` (enabled); ConfigError on no token."""
    from cloud_sync.client import FleetClient  # noqa: PLC0415 - requests only when enabled

    fc = config.fleet
    assert fc.url is not None  # FleetConfig requires it when enabled
    current = [read_token(fc)]
    client = FleetClient(
        fc.url, current[0], session_for(fc), connect_timeout_s=fc.connect_timeout_s,
        read_timeout_s=fc.read_timeout_s, clock=clock, gzip_level=fc.gzip_level,
    )

    def refresh_token() -> bool:  # after a 401/403: the operator may have re-enrolled us
        token = read_token(fc)
        if token == current[0]:
            return False
        current[0] = token
        client.set_token(token)
        return True

    return Uploader(
        store, client, config.agent.device_id, metrics, batch_records=fc.batch_records,
        interval_s=fc.interval_s, backoff_max_s=fc.backoff_max_s,
        max_bytes_per_s=fc.max_bytes_per_s, max_in_flight=fc.max_in_flight, clock=clock,
        refresh_token=refresh_token, abort=client.abort, slow_request_s=fc.read_timeout_s,
    )


def build_updater(config: AgentConfig, streams: Mapping[str, SensorStream], metrics: Metrics,
                  clock: Clock, store: ModelStore, keys: TrustedKeys) -> Updater:
    """The model updater over the sensor ``streams`` (``[updater]`` and ``[fleet]`` enabled)."""
    from cloud_sync.client import FleetClient  # noqa: PLC0415 - requests only when enabled

    fc = config.fleet
    assert fc.url is not None
    client = FleetClient(fc.url, read_token(fc), session_for(fc),
                         connect_timeout_s=fc.connect_timeout_s,
                         read_timeout_s=fc.read_timeout_s, clock=clock)
    handles = {}
    for name, s in streams.items():
        assert s.slot is not None
        rec = store.active(name)
        handles[name] = StreamHandle(
            name, s.slot, s.pipeline, s.config.threshold_quantile,
            installed=rec if rec is not None and Path(rec.path) == s.package.path else None,
        )

    def wrap(stream: str, backend: Backend) -> Backend:
        hist = metrics.inference_seconds.labels(stream=stream, backend=backend.name)
        return TimedBackend(backend, hist.observe)

    uc = config.updater
    guard = PackageGuard(
        HighWater(store.root / HIGH_WATER_FILE),
        load_rollback_policy(uc.rollback_keys_dir, uc.rollback_max_age_s, keys),
        config.agent.device_id, uc.max_archive_bytes, clock,
    )
    return Updater(uc, client, store, handles, config.agent.device_id, keys,
                   metrics, wrap_backend=wrap, clock=clock, guard=guard,
                   abort=client.abort)


def build_samples(config: AgentConfig, streams: Mapping[str, SensorStream],
                  collectors: dict[str, SampleCollector], clock: Clock) -> SampleUploader:
    """Sample collectors for every sensor stream (added to ``collectors``, by stream name) and
    their uploader (``[samples]`` enabled)."""
    from cloud_sync.client import FleetClient  # noqa: PLC0415 - requests only when enabled

    fc = config.fleet
    assert fc.url is not None  # AgentConfig requires [fleet] for [samples]
    for name, s in streams.items():
        m = s.package.manifest
        collectors[name] = SampleCollector(
            config.agent.device_id, name, s.pipeline.spec.channels, s.pipeline.spec.window,
            m.input.sample_rate_hz, (m.name, m.version),
            config_hash(s.config.model_dump_json(), s.package.label),
            config.samples.reservoir_size,
        )
    client = FleetClient(fc.url, read_token(fc), session_for(fc),
                         connect_timeout_s=fc.connect_timeout_s,
                         read_timeout_s=fc.read_timeout_s, clock=clock)
    return SampleUploader(client, collectors, config.samples.upload_interval_s)


def build_health_reporter(config: AgentConfig, streams: Mapping[str, SensorStream],
                          store: Store, report: Callable[[], Report], clock: Clock
                          ) -> HealthReporter:
    """The health reporter of ``[fleet]`` (its own client: a slow health post never holds an
    upload connection)."""
    from cloud_sync.client import FleetClient  # noqa: PLC0415 - requests only when enabled

    fc = config.fleet
    assert fc.url is not None
    client = FleetClient(fc.url, read_token(fc), session_for(fc),
                         connect_timeout_s=fc.connect_timeout_s,
                         read_timeout_s=fc.read_timeout_s, clock=clock)

    def build() -> HealthSummary:
        models = [(n, s.package.manifest.name, s.package.manifest.version)
                  for n, s in streams.items()]
        backlog = store.upload_backlog()
        return summarize(report(), config.agent.device_id, __version__,
                         backlog, models)

    return HealthReporter(client, build, fc.health_interval_s)


def build_sparkplug(config: AgentConfig, streams: list[str], metrics: Metrics
                     ) -> SparkplugEdgeNode:
    """The Sparkplug B edge node (``[mqtt.sparkplug]`` enabled); ConfigError without protobuf."""
    try:
        from agent.publish.sparkplug_edge import (  # noqa: PLC0415 - protobuf only when used
            SparkplugEdgeNode,
        )
    except ImportError as exc:
        msg = (f"mqtt.sparkplug.enabled needs protobuf ({exc}); install "
               "'edge-anomaly-agent[sparkplug]'")
        raise ConfigError(msg, problems=[msg]) from None
    return SparkplugEdgeNode(config.mqtt, config.agent.device_id, streams, metrics,
                             Path(config.agent.state_dir))


def open_model_store(config: AgentConfig) -> tuple[ModelStore, TrustedKeys]:
    """``<state_dir>/models`` and the pinned keys of ``[updater]``; ConfigError on bad keys."""
    assert config.updater.trusted_keys_dir is not None  # UpdaterConfig requires it when enabled
    keys = load_keys_dir(config.updater.trusted_keys_dir, "updater.trusted_keys_dir")
    return ModelStore(Path(config.agent.state_dir) / "models"), keys
