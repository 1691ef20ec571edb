"""The agent's whole configuration as strict pydantic models (one TOML file).

TOML shape::

    [agent]          AgentSection   device identity, state directory, logging, metrics port
    [[streams]]      StreamConfig   one per input stream (at least one)
      [streams.source]              the config of one installed source kind, chosen by ``kind``
                                    (agent.sources.registry: Replay-, Serial-, Modbus- ...)
      [streams.rules]  RulesConfig  k-of-n alerting, hysteresis, cooldown
    [store]          StoreSection   SQLite store and aggregation interval
    [storage]        StorageSection one disk budget across store, models, caches (agent.disk_budget)
    [mqtt]           MqttConfig     alert publisher (off by default; agent.publish.mqtt)
    [fleet]          FleetConfig    cloud upload (off by default; agent.services.uploader)
    [samples]        SamplesConfig  retraining samples (off by default; agent.services.samples)
    [snapshots]      SnapshotConfig camera alert snapshots (agent.services.snapshots)
    [updater]        UpdaterConfig  model updates from the fleet (off; agent.services.updater)

Relative paths:
    Paths in the file (``agent.state_dir``, ``streams.model``, a replay ``path``,
    ``mqtt.password_file``, ``mqtt.ca_file``, ``mqtt.cert_file``, ``mqtt.key_file``,
    ``mqtt.key_password_file``, ``fleet.token_file``, ``fleet.ca_file``,
    ``updater.trusted_keys_dir``, ``updater.rollback_keys_dir``)
    are relative to the directory of the config file; ``store.path`` is relative to
    ``agent.state_dir``. A model value ``builtin:<name>`` names a package shipped with the agent
    (the checkout's ``models/`` or the wheel's package data: agent.config.builtin_models).
    :meth:`AgentConfig.resolved` returns a copy with every path absolute; the composition root
    calls it once.

The models validate only what can be known from the file itself: whether ``window``/``hop`` fit
the model package or a model directory exists is checked when the package is loaded. A camera
stream given a sensor-only key (:data:`SENSOR_ONLY_KEYS`, ``rules.top_channels``) is a problem
at that key's path.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from agent.config.base import StrictModel
from agent.config.builtin_models import CHECKOUT_MODELS_DIR, find_builtin
from agent.publish.mqtt import MqttConfig
from agent.services.samples import SamplesConfig
from agent.services.snapshots import SnapshotConfig
from agent.services.updater import UpdaterConfig
from agent.services.uploader import FleetConfig
from agent.sources.camera import CameraConfig
from agent.sources.registry import path_fields, source_config_union, source_kinds
from agent.sources.replay import ReplayConfig
from agent.sources.serial import SerialConfig
from agent.sources.simulator import FaultConfig, SimulatorConfig
from agent.sources.valid_range import ValidRangeConfig

#: Names that end up in MQTT topics, metric labels and file names.
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"

#: Prefix of a model value naming a package shipped in the repository's ``models/`` directory.
BUILTIN_PREFIX = "builtin:"

#: ``<checkout>/models``; the lookup order of ``builtin:`` names: agent.config.builtin_models.
BUILTIN_MODELS_DIR = CHECKOUT_MODELS_DIR

if TYPE_CHECKING:  # the core's view: the kinds it special-cases, and any plugin's kind
    from agent.sources.registry import PluginSourceConfig

    SourceConfig = Annotated[
        ReplayConfig | SerialConfig | SimulatorConfig | CameraConfig | PluginSourceConfig,
        Field(discriminator="kind"),
    ]
else:  # every installed kind (agent.sources.registry: entry points of edge_agent.sources)
    SourceConfig = source_config_union()
"""One source config; the ``kind`` key selects the class."""

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


def _problem(
    kind: str, message: str, loc: tuple[str | int, ...], value: object
) -> InitErrorDetails:
    """Build one located validation error (raised together through ``ValidationError``)."""
    return InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=value)


def _raise_problems(title: str, problems: list[InitErrorDetails]) -> None:
    """Raise ``problems`` as one ValidationError; pydantic prefixes each with the field's path."""
    if problems:
        raise ValidationError.from_exception_data(title, problems)


class AgentSection(StrictModel):
    """Device identity, state directory, logging and metrics."""

    device_id: str = Field(
        "edge-demo",
        pattern=NAME_PATTERN,
        description="Device name used in MQTT topics and uploads: 1-64 of A-Z a-z 0-9 _ . -",
    )
    state_dir: str = Field(
        "./state",
        min_length=1,
        description="Directory for the store and calibration state; a relative path is relative "
        "to the config file's directory.",
    )
    log_level: LogLevel = Field("INFO", description="Log level: DEBUG, INFO, WARNING or ERROR.")
    log_format: Literal["auto", "text", "journal", "json"] = Field(
        "auto",
        description="Log format: 'text' (timestamped lines), 'journal' (each line starts with "
        "its sd-daemon priority such as <4> and has no timestamp: journald stamps it), 'json' "
        "(one object per line "
        "with the structured fields: stream, alert_id, model_version ...; priority-prefixed "
        "under journald) or 'auto' = journal when stderr is systemd's journal stream "
        "(JOURNAL_STREAM), else text (docs/operations.md).",
    )
    console_alerts: bool = Field(True, description="Print every alert on stdout.")
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        examples=[9851],
        description="TCP port of the /metrics (Prometheus) and /healthz (JSON) endpoint; "
        "unset = no endpoint.",
    )
    metrics_address: str = Field(
        "127.0.0.1",
        min_length=1,
        examples=["192.168.10.5"],
        description="Address the /metrics and /healthz endpoint binds; 127.0.0.1 = this host "
        "only, 0.0.0.0 = every interface (for a Prometheus on another host).",
    )


class RulesConfig(StrictModel):
    """When a stream's scores become an alert, and when the episode ends."""

    k: int = Field(
        7,
        ge=1,
        description="Alert when k of the last n windows score above the threshold (7 of 10: "
        "no alert in 40 x 20,000 samples of pure noise with the shipped model; 3 of 5 gave 28).",
    )
    n: int = Field(10, ge=1, description="Number of recent windows the k-of-n rule looks at.")
    clear_ratio: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="Hysteresis: an episode ends only after the score stays below "
        "clear_ratio x threshold for clear_windows consecutive windows (0 < clear_ratio <= 1).",
    )
    clear_windows: int = Field(
        5, ge=0, description="Consecutive windows below the clear level that end an episode; "
        "0 = no episodes: every window meeting k of n alerts (subject to cooldown_s)."
    )
    cooldown_s: float = Field(
        60.0,
        ge=0.0,
        description="Minimum seconds between two alerts of one stream, in the stream's own time.",
    )
    spike_factor: float | None = Field(
        None,
        ge=1.0,
        description="Single-window path: outside an episode, one window scoring above "
        "spike_factor x threshold alerts without waiting for k of n (a point anomaly touches "
        "at most W windows). Unset: a univariate package's selected value (manifest "
        "univariate.rule_spike), else off.",
    )
    top_channels: int = Field(
        3, ge=0, description="Channels with the largest contribution named in an alert (0 = none)."
    )
    update_ratio: float = Field(
        1.5,
        ge=0.0,
        description="An open episode sends an 'updated' event when its peak score reaches "
        "update_ratio x the peak last sent (raised or updated); 0 = no 'updated' events. "
        "Must be 0 or above 1.",
    )
    update_interval_s: float = Field(
        60.0,
        ge=0.0,
        description="Least stream time in seconds between two events of one open episode "
        "('raised' then 'updated', or two 'updated'); 'cleared' is never held back.",
    )

    @model_validator(mode="after")
    def _update_ratio(self) -> RulesConfig:
        if 0 < self.update_ratio <= 1:
            _raise_problems("RulesConfig", [_problem(
                "update_ratio", f"update_ratio ({self.update_ratio}) must be 0 (off) or above 1",
                ("update_ratio",), self.update_ratio)])
        return self

    @model_validator(mode="after")
    def _k_within_n(self) -> RulesConfig:
        if self.k > self.n:
            _raise_problems(
                "RulesConfig",
                [
                    _problem(
                        "k_greater_than_n",
                        f"k ({self.k}) must not exceed n ({self.n}): alert when k of the last "
                        "n windows are above the threshold",
                        ("k",),
                        self.k,
                    )
                ],
            )
        return self


#: Stream keys that mean nothing to a camera stream (a config problem when given on one).
SENSOR_ONLY_KEYS = ("window", "hop", "calibration_samples", "recalibrate_on_start",
                    "calibration_max_age_s", "threshold_quantile", "valid_range",
                    "channel")
#: ``[streams.rules]`` keys that mean nothing to a camera stream (its alerts name no channels).
SENSOR_ONLY_RULES = ("top_channels",)


class StreamConfig(StrictModel):
    """One input stream: where readings come from, which model scores them, when to alert."""

    name: str = Field(
        pattern=NAME_PATTERN,
        description="Stream name, unique per agent (MQTT topics, metric labels): "
        "1-64 of A-Z a-z 0-9 _ . -",
    )
    source: SourceConfig = Field(
        description="Where readings come from; 'kind' selects one of the installed source "
        f"kinds: {', '.join(source_kinds())}."
    )
    model: str = Field(
        "builtin:skab-wstat",
        min_length=1,
        description="Model package directory, relative to the config file's directory; "
        "'builtin:<name>' = a package shipped with the agent (docs/install.md).",
    )
    channel: str | None = Field(
        None,
        min_length=1,
        examples=["bearing_temp"],
        description="One-channel (univariate) model packages only: the source channel the "
        "package scores as its single channel; alerts and aggregates name it. Unset = the "
        "source channel named like the package's, else the source's only channel "
        "(docs/detection.md, 'Univariate streams').",
    )
    window: int | None = Field(
        None,
        ge=2,
        examples=[64],
        description="Samples per window; unset = the model package's window.",
    )
    hop: int | None = Field(
        None,
        ge=1,
        examples=[8],
        description="Samples between window starts (<= window); unset = the model package's hop.",
    )
    backend: Literal["auto", "onnxruntime", "openvino", "litert"] = Field(
        "auto",
        description="Inference runtime: 'auto' benchmarks every installed runtime on the "
        "package's artefacts at model activation and uses the fastest that passes the golden "
        "vectors (agent/inference/select.py); or one runtime (openvino and litert need the "
        "extras of the same name).",
    )
    precision: Literal["int8", "fp32"] = Field(
        "int8", description="Which of the package's artefacts to run: int8 or fp32."
    )
    calibration_samples: int = Field(
        400,
        ge=1,
        description="Readings used on the device to fit the scaler and threshold before scoring "
        "(400 = the SKAB protocol's anomaly-free prefix).",
    )
    recalibrate_on_start: bool = Field(
        False,
        description="Calibrate afresh at every start and reload. false = restore the "
        "calibration stored in the state store when it was fitted for the same model package "
        "and the same detector settings (channels, window, calibration_samples, floors, "
        "threshold quantile and factor, precision) and is not older than "
        "calibration_max_age_s; the stream then scores from its first window.",
    )
    calibration_max_age_s: float | None = Field(
        30 * 86400.0,
        gt=0,
        examples=[604800.0],
        description="Seconds (wall clock) after which a stored calibration is no longer "
        "restored and the stream calibrates afresh at its next start (default 30 days); "
        "inf (or None from Python) = never.",
    )
    threshold_quantile: float | None = Field(
        None,
        ge=0.5,
        lt=1.0,
        examples=[0.99],
        description="Quantile of calibration scores used as the threshold (0.5 <= q < 1); "
        "unset = the model package's.",
    )
    stall_after_s: float | None = Field(
        None,
        gt=0,
        examples=[60.0],
        description="Seconds without a reading after which the source counts as stalled and "
        "the systemd watchdog stops (the service restarts); unset = max(10 sample periods, "
        "30 s) for simulator and replay, max(2 x stall_s, 10 frame periods, 30 s) without a "
        "frame outside an outage for camera, and never for serial (a quiet device only shows "
        "yellow in /healthz).",
    )
    valid_range: list[ValidRangeConfig] = Field(
        default_factory=list,
        description="Per channel, the inclusive range a reading can physically have "
        "([[streams.valid_range]] tables: channel, low, high); a reading outside is rejected "
        "at the source and counted (reason out_of_range). Channels not named: any value a "
        "float32 model input holds.",
    )
    rules: RulesConfig = Field(
        default_factory=RulesConfig, description="Alert rules of this stream. A camera stream "
        "whose table gives no key has defaults of its own (agent/services/camera_rules.py): "
        "every anomalous image of a folder alerts; a video or live camera alerts once per "
        "run of anomalous frames. A univariate stream whose table gives no rule key runs "
        "its package's selected k of n (agent/services/stream_rules.py)."
    )

    @field_validator("model")
    @classmethod
    def _builtin_name(cls, value: str) -> str:
        if value.startswith(BUILTIN_PREFIX):
            resolve_model_path(value, Path())  # raises ValueError for a bad builtin name
        return value

    @field_validator("valid_range")
    @classmethod
    def _one_range_per_channel(cls, value: list[ValidRangeConfig]) -> list[ValidRangeConfig]:
        names = [r.channel for r in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"one valid_range per channel; given twice: {twice}")
        return value

    @model_validator(mode="after")
    def _no_sensor_keys_on_a_camera(self) -> StreamConfig:
        if self.source.kind != "camera":
            return self
        given: list[tuple[str, ...]] = [
            (k,) for k in SENSOR_ONLY_KEYS if k in self.model_fields_set
        ]
        given += [("rules", k) for k in SENSOR_ONLY_RULES if k in self.rules.model_fields_set]
        _raise_problems("StreamConfig", [
            _problem(
                "sensor_only_key",
                "applies only to sensor streams (windows, on-device calibration, channels); "
                "a camera stream scores each frame with its image package's threshold: "
                "remove it",
                loc,
                getattr(self.rules if loc[0] == "rules" else self, loc[-1]),
            )
            for loc in given
        ])
        return self

    @model_validator(mode="after")
    def _hop_within_window(self) -> StreamConfig:
        if self.window is not None and self.hop is not None and self.hop > self.window:
            _raise_problems(
                "StreamConfig",
                [
                    _problem(
                        "hop_greater_than_window",
                        f"hop ({self.hop}) must not exceed window ({self.window})",
                        ("hop",),
                        self.hop,
                    )
                ],
            )
        return self


class StoreSection(StrictModel):
    """The local SQLite store (alert outbox, aggregates)."""

    path: str = Field(
        "agent.db",
        min_length=1,
        description="SQLite database file; a relative path is relative to agent.state_dir.",
    )
    aggregate_interval_s: float = Field(
        60.0, gt=0.0, description="Seconds of stream time summarised in one aggregate row."
    )
    budget_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1024 * 1024,
        description="Disk budget of the store in bytes (at least 1 MiB): above it the oldest "
        "rows are evicted, camera snapshots first, then uploaded aggregates, unacknowledged alerts "
        "last.",
    )


class StorageSection(StrictModel):
    """One disk budget across the store, the models, the OpenVINO cache and snapshots."""

    disk_budget_bytes: int | None = Field(
        None,
        ge=8 * 1024 * 1024,
        examples=[2 * 1024**3],
        description="Bytes the agent may keep on disk in all (at least 8 MiB): the store, "
        "the models directory (the active and the previous package of each stream), the "
        "OpenVINO cache and camera snapshots. Over it the OpenVINO cache goes first, then "
        "snapshots (oldest first), then store rows (the store's budget is lowered to what "
        "the rest leaves, never above store.budget_bytes); models are never evicted "
        "(docs/operations.md). Unset = no total: each part is still measured and reported "
        "(edge_agent_disk_bytes, /healthz) and the store keeps store.budget_bytes.",
    )
    check_interval_s: float = Field(
        60.0, gt=0.0, description="Seconds between two measurements of the disk budget."
    )


class AgentConfig(StrictModel):
    """The whole agent configuration (one TOML file)."""

    agent: AgentSection = Field(
        default_factory=AgentSection, description="Device identity, state, logging, metrics."
    )
    streams: list[StreamConfig] = Field(
        min_length=1, description="Input streams, each with its source, model and alert rules."
    )
    store: StoreSection = Field(default_factory=StoreSection, description="Local SQLite store.")
    storage: StorageSection = Field(
        default_factory=StorageSection,
        description="One disk budget across the store, models, OpenVINO cache and snapshots.",
    )
    mqtt: MqttConfig = Field(default_factory=MqttConfig, description="MQTT alert publisher.")
    fleet: FleetConfig = Field(
        default_factory=FleetConfig, description="Upload of alerts and aggregates to the fleet."
    )
    updater: UpdaterConfig = Field(
        default_factory=UpdaterConfig,
        description="Model updates from the fleet (needs [fleet] enabled for its url and token).",
    )

    samples: SamplesConfig = Field(
        default_factory=SamplesConfig,
        description="Retraining samples uploaded to the fleet (needs [fleet] enabled).",
    )
    snapshots: SnapshotConfig = Field(
        default_factory=SnapshotConfig,
        description="Snapshots of camera alerts: frame JPEG and heatmap PNG, stored, published "
        "on retained topics and uploaded to the fleet.",
    )

    @model_validator(mode="after")
    def _updater_needs_fleet(self) -> AgentConfig:
        if self.updater.enabled and not self.fleet.enabled:
            raise ValueError("updater.enabled needs [fleet] enabled (its url and token)")
        if self.samples.enabled and not self.fleet.enabled:
            raise ValueError("samples.enabled needs [fleet] enabled (its url and token)")
        return self

    @field_validator("streams", mode="wrap")
    @classmethod
    def _unique_stream_names(
        cls, value: object, handler: ValidatorFunctionWrapHandler
    ) -> list[StreamConfig]:
        # Wraps the list's own validation so that duplicates are reported together with any
        # other problem inside the streams (an "after" validator would run only if all are valid).
        problems = _duplicate_names(value)
        try:
            streams: list[StreamConfig] = handler(value)
        except ValidationError as exc:
            inner = [
                _problem(str(err["type"]), str(err["msg"]), tuple(err["loc"]), err["input"])
                for err in exc.errors()
            ]
            _raise_problems("streams", inner + problems)
            raise  # pragma: no cover - _raise_problems always raises a non-empty list
        _raise_problems("streams", problems)
        return streams

    def resolved(self, config_dir: Path) -> AgentConfig:
        """Return a copy with every path absolute (see the module docstring for the rules).

        Args:
            config_dir: Directory of the config file (the current directory for the embedded
                defaults).

        Returns:
            A new config; ``agent.state_dir``, ``store.path``, each stream's ``model`` and replay
            ``path``, the ``mqtt`` and ``fleet`` files are absolute path strings.
        """
        state_dir = resolve_path(self.agent.state_dir, config_dir)
        streams = []
        for stream in self.streams:
            source = stream.source
            paths = {
                k: str(resolve_path(v, config_dir))
                for k in path_fields(source.kind) if isinstance(v := getattr(source, k), str)
            }
            if paths:
                source = source.model_copy(update=paths)
            model = str(resolve_model_path(stream.model, config_dir))
            streams.append(stream.model_copy(update={"source": source, "model": model}))
        mqtt_paths = {
            key: str(resolve_path(value, config_dir))
            for key in ("password_file", "ca_file", "cert_file", "key_file", "key_password_file")
            if isinstance(value := getattr(self.mqtt, key), str)
        }
        return self.model_copy(
            update={
                "agent": self.agent.model_copy(update={"state_dir": str(state_dir)}),
                "streams": streams,
                "store": self.store.model_copy(
                    update={"path": str(resolve_path(self.store.path, state_dir))}
                ),
                "mqtt": self.mqtt.model_copy(update=mqtt_paths),
                "fleet": self.fleet.model_copy(update={
                    key: str(resolve_path(value, config_dir))
                    for key in ("token_file", "ca_file")
                    if isinstance(value := getattr(self.fleet, key), str)
                }),
                "updater": self.updater.model_copy(update={
                    key: str(resolve_path(value, config_dir))
                    for key in ("trusted_keys_dir", "rollback_keys_dir")
                    if isinstance(value := getattr(self.updater, key), str)
                }),
            }
        )


def _duplicate_names(value: object) -> list[InitErrorDetails]:
    """Located problems for every stream whose name an earlier stream already uses."""
    if not isinstance(value, list):
        return []
    seen: set[str] = set()
    problems: list[InitErrorDetails] = []
    for index, item in enumerate(value):
        name = item.get("name") if isinstance(item, dict) else getattr(item, "name", None)
        if not isinstance(name, str):
            continue
        if name in seen:
            problems.append(
                _problem(
                    "duplicate_stream_name",
                    f"duplicate stream name '{name}'",
                    (index, "name"),
                    name,
                )
            )
        seen.add(name)
    return problems


def resolve_path(value: str, base: Path) -> Path:
    """Resolve a config path: ``~`` expanded, relative paths joined to ``base``.

    Args:
        value: The path as written in the config.
        base: Directory relative paths are relative to.

    Returns:
        An absolute, normalised path (symlinks are not resolved; the file need not exist).
    """
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base / path
    return Path(*_normalise(path.absolute().parts))


def _normalise(parts: tuple[str, ...]) -> list[str]:
    """Drop ``.`` and fold ``..`` lexically (like ``os.path.normpath``, without symlinks)."""
    out: list[str] = []
    for part in parts:
        if part == "..":
            if len(out) > 1:
                out.pop()
        elif part != ".":
            out.append(part)
    return out


def resolve_model_path(
    value: str, config_dir: Path, builtin_dir: Path | None = None
) -> Path:
    """Resolve a stream's ``model`` value to a package directory.

    Args:
        value: ``builtin:<name>`` for a package shipped in the repository's ``models/``
            directory, or a path (relative paths are relative to ``config_dir``).
        config_dir: Directory of the config file.
        builtin_dir: Where builtin packages live; None = ``$EDGE_AGENT_MODELS_DIR`` when set
            and not empty, else the checkout's ``models/`` or the wheel's package data
            (:func:`agent.config.builtin_models.find_builtin`; tests pass their own).

    Returns:
        The absolute package directory; whether it exists is checked by the package loader.

    Raises:
        ValueError: ``builtin:`` without a name, or with a name containing a path separator.
    """
    if value.startswith(BUILTIN_PREFIX):
        name = value.removeprefix(BUILTIN_PREFIX)
        if not name or "/" in name or "\\" in name or name in {".", ".."}:
            raise ValueError(f"invalid builtin model name {name!r}")
        return find_builtin(name) if builtin_dir is None else builtin_dir / name
    return resolve_path(value, config_dir)


def default_config() -> AgentConfig:
    """The embedded default: one simulator stream, console alerts, no broker, no metrics port.

    The simulator runs 20x faster than real time, so the 400-sample calibration takes 20 s and
    the first injected fault (a drop in flow, 600 simulated seconds in) is flagged about 30 s
    after start; a vibration fault follows at 1200 s.
    """
    demo = SimulatorConfig(
        faults=[
            FaultConfig(kind="offset", channel="Volume Flow RateRMS", start_s=600.0,
                        duration_s=180.0, magnitude=-15.0),
            FaultConfig(kind="noise", channel="Accelerometer1RMS", start_s=1200.0,
                        duration_s=180.0, magnitude=6.0),
        ]
    )
    return AgentConfig(streams=[StreamConfig(name="demo", source=demo)])
