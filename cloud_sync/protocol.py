"""Wire schemas between gateway and fleet (JSON over HTTP), versions 1 and 2.

Ingest: ``POST /v1/ingest`` with ``Authorization: Bearer <device token>``, body an
:class:`IngestBatch` as JSON, usually gzip-compressed (``Content-Encoding: gzip``). Every record
carries an id made on the device that is stable across retries:

* alert: ``<device_id>:<stream>:<seq>`` (``seq`` from the device's store, never reused);
* aggregate: ``<device_id>:<stream>:<interval_start in integer ms>`` for part 0, and
  ``<device_id>:<stream>:<interval_start in integer ms>:<k>`` (``k`` 1..999999, no leading
  zero) for part ``k`` of the same interval (:data:`AGGREGATE_ID_PATTERN`): the device stored
  the interval more than once because it restarted within it, each part summarising other
  readings. Parts are separate records (each its own id); a consumer combines the parts of one
  ``(stream, interval_start)`` (docs/fleet-protocol.md, "Aggregate parts"). A fleet older than
  parts rejects a part id by its pattern (``rejected``, with the reason): the device keeps it in its
  dead-letter table.

Ingest is idempotent on ``(kind, id)``: the same batch sent twice stores each record once. The
response, an :class:`IngestResult`, says per record index whether it was ``accepted`` (stored now),
``duplicate`` (already stored: also safe to clear) or ``rejected`` (with a reason; the device
moves it to its dead-letter table and never resends it). The device clears exactly the records
the response names as accepted or duplicate.

Schema 2 (the fleet accepts 1, 2 and 3, so older agents keep working) adds
``aggregates``, an :class:`AggregateColumns`: the batch's aggregates as columns (entry ``i`` of
every list is aggregate ``i``; all lists of equal length), each aggregate's ``channels`` being
the JSON text of its channel list (what the device stored; a string in the body). Record
indexes run over ``records`` first, then the columns: aggregate ``i`` of the columns is index
``len(records) + i`` in the :class:`IngestResult`, and ``len(records) + len(ids)`` is at most
:data:`MAX_BATCH_RECORDS`. Every column entry is checked as the same field of an
:class:`AggregateBody` would be (a bad entry rejects that index with a reason, never the batch);
the device of an aggregate is the batch's ``device_id`` and its id's first part. Columns of
unequal lengths are a 422. A fleet that only knows schema 1 answers a schema-2 batch with 422;
the agent then sends schema 1 (:mod:`agent.services.uploader`). Why columns: a 5,000-aggregate
backlog batch is checked as a few typed arrays instead of 5,000 nested objects, and stored from
columns without rebuilding rows or channel JSON (docs/fleet-protocol.md, "Throughput").

Schema 3 (:data:`SCHEMA_VERSION`) is schema 2 whose alert records may carry schema-2 bodies: an
episode's ``raised``, ``updated`` and ``cleared`` events (:class:`AlertBody`), each a record with
its own id. A fleet that knows only schema 2 answers a schema-3 batch with 422 naming
``schema``; the agent then sends schema 2 with every ``raised`` event as a schema-1 body and
keeps ``updated``/``cleared`` on the device (marked uploaded, counted), so an older fleet sees
what it saw before.

Errors: 400 malformed body, 401 missing/unknown token, 403 a device writing another device's
records, 413 body or batch too large, 415 wrong content type, 422 schema violation, 429/503 with
``Retry-After`` (seconds) when the fleet sheds load. A 5xx other than 503 is retried with backoff.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Newest ingest schema (what the agent sends); the fleet also accepts 1 and 2.
SCHEMA_VERSION = 3
#: Largest batch the fleet accepts (records); the agent sends at most this many.
MAX_BATCH_RECORDS = 5_000
#: Largest decompressed body the fleet accepts, bytes.
MAX_BODY_BYTES = 16 * 1024 * 1024

#: Camera alert snapshots (``PUT``/``GET /v1/devices/{device_id}/alerts/{alert_id}/<kind>``):
#: the kinds and their content types. The body is the image itself (not JSON): a ``snapshot``
#: is the alerting frame as JPEG, a ``heatmap`` the anomaly overlay as PNG. A fleet that does
#: not know the route answers 404/405 and the device keeps its snapshots to itself; the alert
#: itself always goes through ``/v1/ingest`` (its body without the MQTT payload's ``snapshot``
#: key, so a fleet older than snapshots takes it).
SNAPSHOT_KINDS = {"snapshot": "image/jpeg", "heatmap": "image/png"}
#: Largest snapshot or heatmap body the fleet accepts, bytes.
MAX_SNAPSHOT_BYTES = 4 * 1024 * 1024
#: Largest width or height of a snapshot image the fleet accepts, pixels.
MAX_SNAPSHOT_EDGE = 4096

#: Alert ids (and aggregate part-0 ids): ``<device>:<stream>:<integer>``.
ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}:[A-Za-z0-9_.-]{1,64}:-?[0-9]{1,20}$"
#: Aggregate ids: :data:`ID_PATTERN`, optionally ``:<part>`` with part 1..999999.
AGGREGATE_ID_PATTERN = (
    r"^[A-Za-z0-9_.-]{1,64}:[A-Za-z0-9_.-]{1,64}:-?[0-9]{1,20}(?::[1-9][0-9]{0,5})?$"
)
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
#: Largest integer a wire field may carry: the databases' BIGINT (int64).
INT64_MAX = 2**63 - 1
#: Free text: no NUL character (PostgreSQL ``text``/``jsonb`` cannot hold it).
TEXT_PATTERN = r"^[^\x00]*$"
#: A query or path parameter of free form (a time, an actor): no control character at all.
PLAIN_PATTERN = r"^[^\x00-\x1f\x7f]*$"
#: Most entries, key and text lengths of a status report's ``details``.
MAX_DETAILS, MAX_DETAIL_KEY, MAX_DETAIL_TEXT = 32, 64, 512


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChannelStatsBody(_Wire):
    """One channel's stats over an interval (channel units)."""

    channel: str = Field(min_length=1, max_length=128, description="Channel name.")
    count: int = Field(ge=0, description="Readings of the channel in the interval.")
    min: float | None = Field(description="Smallest reading; null when not finite.")
    max: float | None = Field(description="Largest reading; null when not finite.")
    mean: float | None = Field(description="Mean reading; null when not finite.")
    std: float | None = Field(
        ge=0, description="Population standard deviation; null when not finite.")


class AggregateBody(_Wire):
    """An aggregate as sent on the wire (see :class:`agent.records.Aggregate`)."""

    device_id: str = Field(pattern=NAME_PATTERN, description="The device (the token's).")
    stream: str = Field(pattern=NAME_PATTERN, description="Stream name.")
    interval_start: float = Field(ge=0, le=32503680000, description="Epoch seconds UTC.")
    interval_s: float = Field(gt=0, le=86400, description="Interval length, seconds.")
    count: int = Field(ge=0, description="Readings in the interval.")
    channels: list[ChannelStatsBody] = Field(max_length=1024,
                                             description="Per-channel stats (at most 1,024).")
    max_score: float | None = Field(
        description="Largest window score in the interval; null when no window was scored.")
    windows: int = Field(ge=0, description="Windows scored in the interval.")
    alert_count: int = Field(ge=0, description="Alerts raised in the interval.")


class TopChannelBody(_Wire):
    """A channel that contributed to an alert's score."""

    channel: str = Field(min_length=1, max_length=128, description="Channel name.")
    contribution: float = Field(ge=0, le=1, description="Its share of the score, 0..1.")


class ModelRef(_Wire):
    """A model package: name and version."""

    name: str = Field(min_length=1, max_length=64, pattern=TEXT_PATTERN,
                      description="Model package name.")
    version: int = Field(ge=0, le=INT64_MAX, description="Model package version.")


class AlertSourceBody(_Wire):
    """Where a recorded camera input's alerting frame came from (optional on an alert).

    ``file``: an image folder's file relative to the folder, or a video file's name (bytes that
    are not UTF-8 sent as U+FFFD); ``frame``: a video file's 0-based frame index (absent for a
    folder image).
    """

    file: str = Field(min_length=1, max_length=1024,
                      description="Image file relative to the folder, or the video file's name.")
    frame: int | None = Field(None, ge=0, description="0-based video frame; absent for an image.")


class AlertExplanationBody(_Wire):
    """A univariate stream's alert explained (optional on an alert): the expected value (the
    bounded baseline), the alerting window's mean, their difference (channel units) and that
    difference in calibration sigmas."""

    expected: float = Field(allow_inf_nan=False,
                            description="Expected value (the bounded baseline), channel units.")
    observed: float = Field(allow_inf_nan=False,
                            description="Mean of the alerting window, channel units.")
    deviation: float = Field(allow_inf_nan=False,
                             description="observed - expected, channel units.")
    deviation_sigma: float = Field(allow_inf_nan=False,
                                   description="The deviation in calibration sigmas.")


AlertEvent = Literal["raised", "updated", "cleared"]


class AlertBody(_Wire):
    """An alert episode's event: the MQTT payload, schema 1 or 2 (see :mod:`agent.publish.mqtt`).

    Schema 2 adds ``event`` (``raised``, ``updated``, ``cleared``), ``episode_id`` (the
    ``alert_id`` of the episode's ``raised`` event) and, on ``updated``/``cleared``,
    ``peak_score``. A schema-1 body is a ``raised`` event that is its own episode. Bodies of
    schema 2 travel in ingest batches of schema 3 (:data:`SCHEMA_VERSION`); an agent talking to
    a fleet older than that sends ``raised`` events as schema 1 and keeps the others on the
    device (:mod:`agent.services.uploader`).

    ``source`` is an optional, additive field (still schema 1): only alerts of a recorded camera
    input (image folder, video file) carry it. ``explanation`` likewise: only alerts of a
    univariate stream carry it. A fleet older than a field rejects alerts carrying it
    (``extra="forbid"``): upgrade the fleet first.
    """

    schema_: Literal[1, 2] = Field(alias="schema", description="Alert payload schema, 1 or 2.")
    event: AlertEvent | None = Field(None, description="None (schema 1): raised.")
    episode_id: str | None = Field(
        None, pattern=ID_PATTERN, description="alert_id of the episode's raised event (schema 2).")
    peak_score: float | None = Field(
        None, description="Highest score of the episode so far (updated/cleared).")
    reason: Literal["recovered", "end_of_input"] | None = Field(
        None, description="Why a cleared episode ended.")
    alert_id: str = Field(pattern=ID_PATTERN, description="<device_id>:<stream>:<seq>.")
    device_id: str = Field(pattern=NAME_PATTERN, description="The device (the token's).")
    stream: str = Field(pattern=NAME_PATTERN, description="Stream name.")
    seq: int = Field(ge=0, description="The device's alert sequence number (never reused).")
    model: ModelRef = Field(description="The model that scored the window.")
    score: float = Field(description="The window's anomaly score.")
    threshold: float = Field(description="The alert threshold in force.")
    window_start: str = Field(max_length=40, description="ISO 8601 UTC with Z.")
    window_end: str = Field(max_length=40, description="ISO 8601 UTC with Z.")
    raised_at: str = Field(max_length=40, description="When the device raised it, ISO 8601 UTC.")
    top_channels: list[TopChannelBody] = Field(
        max_length=64, description="Channels that contributed most (at most 64).")
    source: AlertSourceBody | None = Field(
        None, description="Where a recorded camera input's frame came from.")
    explanation: AlertExplanationBody | None = Field(
        None, description="Expected vs observed value (univariate streams).")


class AggregateColumns(_Wire):
    """Schema 2: a batch's aggregates as columns, entry ``i`` of each list being aggregate ``i``.

    Each entry is checked as the :class:`AggregateBody` field of the same name (``ids`` as an
    aggregate record id, :data:`AGGREGATE_ID_PATTERN`; ``streams`` as ``stream``);
    ``channels[i]`` is the JSON TEXT of a ``list[ChannelStatsBody]``; ``max_score[i]`` may be
    ``null``. Lengths must be equal (checked by the fleet, 422 otherwise). Units as
    :class:`AggregateBody`: epoch seconds UTC, seconds.
    """

    ids: list[Annotated[str, Field(pattern=AGGREGATE_ID_PATTERN)]] = Field(
        max_length=MAX_BATCH_RECORDS, description="Aggregate record ids."
    )
    streams: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        max_length=MAX_BATCH_RECORDS, description="Stream names."
    )
    interval_start: list[Annotated[float, Field(ge=0, le=32503680000)]] = Field(
        max_length=MAX_BATCH_RECORDS, description="Interval starts, epoch seconds UTC."
    )
    interval_s: list[Annotated[float, Field(gt=0, le=86400)]] = Field(
        max_length=MAX_BATCH_RECORDS, description="Interval lengths, seconds."
    )
    count: list[Annotated[int, Field(ge=0)]] = Field(
        max_length=MAX_BATCH_RECORDS, description="Readings per interval.")
    channels: list[str] = Field(
        max_length=MAX_BATCH_RECORDS,
        description="JSON text of each aggregate's channel stats list (ChannelStatsBody).")
    max_score: list[float | None] = Field(
        max_length=MAX_BATCH_RECORDS, description="Largest window score; null: none scored.")
    windows: list[Annotated[int, Field(ge=0)]] = Field(
        max_length=MAX_BATCH_RECORDS, description="Windows scored per interval.")
    alert_count: list[Annotated[int, Field(ge=0)]] = Field(
        max_length=MAX_BATCH_RECORDS, description="Alerts raised per interval.")


#: Column names of :class:`AggregateColumns`, in wire order.
AGGREGATE_COLUMNS = tuple(AggregateColumns.model_fields)
#: What ``AggregateColumns.channels[i]`` must hold once parsed as JSON.
Channels = Annotated[list[ChannelStatsBody], Field(max_length=1024)]


class AlertRecord(_Wire):
    """An alert event in an ingest batch."""

    kind: Literal["alert"] = Field(description="Record kind: alert.")
    id: str = Field(pattern=ID_PATTERN, description="Stable record id (the body's alert_id).")
    body: AlertBody = Field(description="The alert event.")


class AggregateRecord(_Wire):
    """An aggregate in an ingest batch (schema 1; schema 2+ may use the columns instead)."""

    kind: Literal["aggregate"] = Field(description="Record kind: aggregate.")
    id: str = Field(pattern=AGGREGATE_ID_PATTERN,
                    description="<device_id>:<stream>:<interval_start ms>[:<part>].")
    body: AggregateBody = Field(description="The aggregate.")


Record = AlertRecord | AggregateRecord


class Backlog(_Wire):
    """What the device still holds unsent (reported so operators see lagging gateways)."""

    alerts: int = Field(ge=0, description="Alerts not yet uploaded.")
    aggregates: int = Field(ge=0, description="Aggregates not yet uploaded.")


class IngestBatch(_Wire):
    """``POST /v1/ingest`` body (``aggregates`` only with ``schema`` 2 or 3)."""

    schema_: Literal[1, 2, 3] = Field(1, alias="schema", description="Ingest schema, 1 to 3.")
    device_id: str = Field(pattern=NAME_PATTERN,
                           description="The sending device; must be the token's.")
    sent_at: float = Field(description="Epoch seconds UTC when the batch was sent.")
    agent_version: str = Field("", max_length=64, description="The agent's version.")
    model: ModelRef | None = Field(None, description="The model the device runs, if one.")
    backlog: Backlog = Field(description="What the device still holds unsent.")
    aggregates: AggregateColumns | None = Field(
        None, description="Schema 2+: aggregates as columns, indexed after records.")
    records: list[Record] = Field(
        max_length=MAX_BATCH_RECORDS,
        description=f"Alert and aggregate records (with the columns at most {MAX_BATCH_RECORDS}).")

    def all_records(self) -> list[Record]:
        """Every record in index order: ``records``, then each column entry as the
        :class:`AggregateRecord` it stands for (device: ``device_id``; channels parsed).

        Raises:
            pydantic.ValidationError: A column entry is not a valid record.
            ValueError: A channels text is not JSON.
        """
        out: list[Record] = list(self.records)
        c = self.aggregates
        if c is None:
            return out
        for i, rid in enumerate(c.ids):
            out.append(AggregateRecord.model_validate({"kind": "aggregate", "id": rid, "body": {
                "device_id": self.device_id, "stream": c.streams[i],
                "interval_start": c.interval_start[i], "interval_s": c.interval_s[i],
                "count": c.count[i], "channels": json.loads(c.channels[i]),
                "max_score": c.max_score[i], "windows": c.windows[i],
                "alert_count": c.alert_count[i],
            }}))
        return out


RecordStatus = Literal["accepted", "duplicate", "rejected"]


class RecordResult(_Wire):
    index: int = Field(ge=0)
    status: RecordStatus
    reason: str | None = None


class IngestResult(_Wire):
    """``POST /v1/ingest`` 200 response: one result per record, by index."""

    results: list[RecordResult]


class EnrollRequest(_Wire):
    """``POST /v1/devices`` (admin token): register a device."""

    device_id: str = Field(pattern=NAME_PATTERN, description="New device id.")
    tags: list[Annotated[str, Field(min_length=1, max_length=64, pattern=TEXT_PATTERN)]] = Field(
        default_factory=list, max_length=32, description="Tags (rollout targets; at most 32)."
    )


class EnrollResponse(_Wire):
    """The device token, shown once; the fleet stores only its hash."""

    device_id: str
    token: str


# --- model loop (registry, rollouts, device updates, retraining samples) ------------------------
#
# Device side, all with the device token:
#   GET  /v1/models/assignment?stream=<name>  -> 200 ModelAssignment, or 204 when nothing is
#        assigned to this device/stream (keep the installed model).
#   GET  /v1/models/<name>/<version>/package  -> the package archive (tar.gz of the package
#        directory: manifest.json + artefacts). Supports ``Range: bytes=<start>-`` (206) so an
#        interrupted download resumes; ``ETag`` = the archive sha256. 403 for a package that is
#        not assigned to this device.
#   POST /v1/models/status  (ModelStatusReport) -> 204; every state change of an update.
#   POST /v1/samples  (SampleBatch, gzip JSON like ingest) -> 200 {"stored": n}.
# Operator side (admin token): see fleet/ (push, list, rollouts: create/promote/pause/abort).

ModelState = Literal[
    "assigned", "downloaded", "verified", "accepted", "shadow", "active", "rejected",
    "rolled_back",
]


#: Model package names: what may become part of a path on the gateway (``<name>-<version>``);
#: the same rule as :attr:`cloud_sync.manifest.Manifest.name` (no ``/``, no leading ``.``).
PACKAGE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
#: Stream names on the wire of the model loop: :data:`NAME_PATTERN` without a leading ``.``
#: (so never ``.`` or ``..``).
STREAM_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$"
#: Largest ``archive_size`` an assignment may announce, bytes (the agent's own limit,
#: ``updater.max_archive_bytes``, is usually lower).
MAX_ARCHIVE_BYTES = 4 * 1024 * 1024 * 1024
#: Package URLs: a path on the fleet of 1-16 segments none of which starts with ``.`` (so no
#: ``..``), no scheme, host, query or percent escape.
PACKAGE_URL_PATTERN = r"^(?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]{0,127}){1,16}$"


class SignedRollback(_Wire):
    """Operator permission to install an OLDER version (anti-rollback exception).

    It names the one assignment it belongs to: ``rollout_id`` (the rollout it undoes, equal to
    the assignment's), ``device_id``, ``stream``, model ``name``, ``from_version`` (the newest
    version of that name the stream ran) and ``to_version`` (the assigned version), and
    expires: the device refuses it when ``issued_at`` (epoch seconds UTC) is older than its
    ``updater.rollback_max_age_s`` or in the future. A device also refuses the rollback of a
    rollout older than the newest rollout it has installed from on that stream (a captured
    rollback replayed after a later rollout; :mod:`cloud_sync.rollback`).

    ``signature`` is Ed25519 (base64) over the canonical JSON of
    ``{"role": "rollback", "rollout_id", "device_id", "stream", "name", "from_version",
    "to_version", "issued_at"}`` (:func:`cloud_sync.manifest.canonical_bytes` of that dict), by
    a key of the device's rollback trust set (``updater.rollback_keys_dir``), never a
    package-signing key. A rollback without ``stream`` or without ``rollout_id`` (signed by an
    older fleet) is refused, with a message that says so. An older agent refuses a rollback that
    carries ``rollout_id`` as an invalid assignment (unknown field).
    """

    rollout_id: int | None = Field(
        None, ge=0, le=2**63 - 1,
        description="Rollout this rollback undoes (None: an older fleet's, refused).",
    )

    device_id: str = Field(pattern=NAME_PATTERN)
    stream: str | None = Field(None, pattern=STREAM_PATTERN)
    name: str = Field(pattern=PACKAGE_NAME_PATTERN)
    from_version: int = Field(ge=0, le=2**63 - 1)
    to_version: int = Field(ge=1, le=2**63 - 1)
    issued_at: float = Field(ge=0, le=32503680000)
    key_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    signature: str = Field(max_length=256)


class ModelAssignment(_Wire):
    """What the fleet wants this device/stream to run.

    Every name that becomes part of a path on the gateway is checked here, at parse time:
    ``name`` matches :data:`PACKAGE_NAME_PATTERN`, ``stream`` :data:`STREAM_PATTERN`, ``url``
    :data:`PACKAGE_URL_PATTERN`; an assignment that fails is refused as a whole
    (:class:`cloud_sync.errors.AssignmentInvalid` on the agent).
    """

    rollout_id: int | None = Field(
        None, ge=0, le=2**63 - 1, description="Rollout that assigned it, if any."
    )
    stream: str | None = Field(
        None, pattern=STREAM_PATTERN, description="Stream it targets; None = every stream."
    )
    name: str = Field(pattern=PACKAGE_NAME_PATTERN)
    version: int = Field(ge=1, le=2**63 - 1)
    archive_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    archive_size: int = Field(ge=1, le=MAX_ARCHIVE_BYTES)
    url: str = Field(
        pattern=PACKAGE_URL_PATTERN, max_length=1024,
        description="Path of the archive, relative to the fleet base URL.",
    )
    rollback: SignedRollback | None = None


DetailKey = Annotated[str, Field(min_length=1, max_length=MAX_DETAIL_KEY, pattern=TEXT_PATTERN)]
DetailValue = (
    float  # NaN/Infinity leave the agent as null; the fleet refuses the literals (422)
    | Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
    | Annotated[str, Field(max_length=MAX_DETAIL_TEXT, pattern=TEXT_PATTERN)]
    | None
)


class ModelStatusReport(_Wire):
    """A device's report of one update step (``details``: at most :data:`MAX_DETAILS` entries,
    keys up to :data:`MAX_DETAIL_KEY` characters, texts up to :data:`MAX_DETAIL_TEXT`)."""

    device_id: str = Field(pattern=NAME_PATTERN, description="The device; must be the token's.")
    stream: str | None = Field(None, pattern=NAME_PATTERN,
                               description="The stream updated; None: every stream.")
    name: str = Field(pattern=NAME_PATTERN, description="Model package name.")
    version: int = Field(ge=1, le=INT64_MAX, description="Model package version.")
    rollout_id: int | None = Field(None, ge=1, le=INT64_MAX,
                                   description="The rollout that assigned it, if any.")
    state: ModelState = Field(description="The step reached (assigned ... active, rejected, "
                                          "rolled_back).")
    reason: str | None = Field(None, max_length=2000, pattern=TEXT_PATTERN,
                               description="Why (a rejection, a rollback).")
    details: dict[DetailKey, DetailValue] = Field(
        default_factory=dict, max_length=MAX_DETAILS,
        description="Step details: numbers, texts or null (e.g. shadow agreement figures).")
    at: float = Field(ge=0, le=32503680000, description="Epoch seconds UTC.")


class SampleBatch(_Wire):
    """Raw samples kept by the device for retraining in the cloud.

    ``kind="reservoir"``: ``windows`` has shape (K, W, C), raw windows the device classified
    normal (a uniform reservoir sample). ``kind="calibration"``: ``windows`` holds ONE block, shape
    (1, N, C): the stream's first N raw readings (its calibration period). Values in the
    channels' units (unscaled), finite floats. The fleet answers 200 ``{"stored": <windows>}``.
    """

    device_id: str = Field(pattern=NAME_PATTERN, description="The device; must be the token's.")
    stream: str = Field(pattern=NAME_PATTERN, description="Stream name.")
    channels: list[Annotated[str, Field(min_length=1, max_length=128, pattern=TEXT_PATTERN)]] = (
        Field(min_length=1, max_length=256, description="Channel names, in the windows' C order.")
    )
    model: ModelRef | None = Field(None, description="The model the stream ran, if one.")
    config_hash: str = Field(max_length=128, pattern=TEXT_PATTERN,
                             description="Hash of the stream's config (samples of one config "
                                         "train together).")
    sample_rate_hz: float | None = Field(None, ge=0, le=1e9,
                                         description="Readings per second, if known.")
    kind: Literal["calibration", "reservoir"] = Field(
        "reservoir", description="reservoir: normal windows (K, W, C); calibration: one block "
                                 "(1, N, C).")
    windows: list[list[list[float]]] = Field(
        max_length=10_000, description="Raw values in channel units, finite floats.")
