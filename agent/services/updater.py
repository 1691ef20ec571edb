"""Model updates on the gateway (``[updater]``): poll, download, verify, accept, shadow, swap.

One thread (``model-updater``) loops over the streams: every ``poll_interval_s`` (± 10 %
jitter), or at once when :meth:`Updater.notify` is called (an MQTT message on
``<prefix>/<device_id>/<notify_topic>``), it asks the fleet for each stream's assignment
(:meth:`cloud_sync.client.FleetClient.assignment`). A new assignment goes through:

0. the assignment's names were checked when it was parsed, and its announced size against
   ``max_archive_bytes`` (:mod:`agent.services.package_guard`): nothing is written before;
1. ``downloaded``: the archive to ``<state_dir>/models/incoming/`` (resumable with Range);
2. ``verified``: :func:`cloud_sync.archive.unpack_verified`: the manifest's signature by a
   pinned key of ``trusted_keys_dir`` and anti-rollback across names (the stream's high-water
   marks, or the assignment's signed rollback by a key of ``rollback_keys_dir`` for this
   device and stream, :mod:`cloud_sync.rollback`) BEFORE anything is unpacked; then only the
   members the manifest names, hashes checked while written;
3. ``accepted``: on this device, the INT8 artefact reproduces the golden outputs and its p99
   latency per window is within the package's budget (:mod:`agent.services.model_checks`);
4. ``shadow``: calibrated on the stream's own calibration samples, the candidate scores the next
   ``shadow_windows`` live windows beside the active model (in the pipeline thread); alert rate
   and score distribution must stay within the limits;
   Before the swap the updater asks for the assignment again: when the fleet no longer
   assigns the candidate (its rollout was aborted, paused or halted during the shadow run) the
   candidate is dropped, unreported and not marked refused, and the active model stays.
5. ``active``: the pipeline thread swaps detector and calibration between two blocks
   (:mod:`agent.services.model_slot`), the package is recorded in ``active.json``
   (:mod:`agent.services.model_store`) so a restart comes back on it, and the previous model is
   kept. During a watch of ``shadow_windows`` more windows the previous model scores beside the
   new one; an alert rate beyond the limits against it on the same windows, or at any time a
   :class:`~agent.errors.ModelError` from the new backend, swaps the previous model back:
   ``rolled_back`` (that version is then never installed again on the stream).

Any failed step ends in ``rejected`` with the reason; the running model is untouched. Every state
is reported to the fleet (:class:`~cloud_sync.protocol.ModelStatusReport`; reports that fail are
retried on the next pass), counted in ``edge_agent_model_updates_total{stream,state}`` and logged
once. A download that breaks is resumed on the next pass without a report as long as each resume
brings new bytes; one that ends short again without a new byte (a fleet that announces more than
it sends), an archive whose size or sha256 differs from the assignment, or one that cannot be
written or installed (a full disk), is tried again at most ``download_tries`` times, with
backoff (:mod:`agent.services.update_retry`), then rejected. At most one partial download
(``incoming/*.part``) is kept per stream: the current assignment's; any other is deleted when a
stream starts a download or has nothing to download. One stream's update runs to its end
(through the watch) before the next stream is looked at. At its first pass the updater reports
each stream's running package as ``active`` (no rollout; ``details.origin`` = ``configured`` or
``installed``), so the fleet knows the version an abort of the first rollout goes back to.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import Field, model_validator

from agent.errors import ModelError
from agent.inference.base import Backend
from agent.inference.package import ModelPackage, load_package, saturation_fallback
from agent.metrics import Metrics
from agent.pipeline.detector import Calibration, FeatureDeviationDetector
from agent.pipeline.stream import StreamPipeline
from agent.pipeline.univariate_detector import build_detector
from agent.services.model_checks import Limits, ShadowRun, acceptance_test
from agent.services.model_report import running_report
from agent.services.model_slot import ModelSlot, Observe, Rollback, Swap
from agent.services.model_store import Installed, ModelStore
from agent.services.package_guard import (
    HIGH_WATER_FILE,
    GuardConfig,
    HighWater,
    PackageGuard,
    salvage,
)
from agent.services.update_retry import RetryBudget
from cloud_sync.archive import unpack_verified
from cloud_sync.errors import (
    AssignmentInvalid,
    FleetAuthError,
    FleetDownloadShort,
    FleetError,
    FleetProtocolError,
    FleetRejected,
    PackageError,
)
from cloud_sync.package import TrustedKeys
from cloud_sync.protocol import ModelAssignment, ModelState, ModelStatusReport

KIND = "updater"

log = logging.getLogger("agent.updater")

#: Status reports kept for a retry while the fleet is unreachable (oldest dropped first).
UNSENT_LIMIT = 256
_WAIT_STEP_S = 0.1


class UpdaterConfig(GuardConfig):
    """Config of the model updater (``[updater]``; needs ``[fleet]`` enabled; the package
    limits and rollback keys: :class:`~agent.services.package_guard.GuardConfig`)."""

    enabled: bool = Field(False, description="Poll the fleet for model updates and apply them.")
    poll_interval_s: float = Field(
        300.0, gt=0.0, description="Seconds between assignment polls (±10 % jitter)."
    )
    trusted_keys_dir: str | None = Field(
        None, examples=["/etc/edge-agent/trusted-keys"],
        description="Directory of pinned Ed25519 public keys (*.pub, key id = file stem); a "
        "package must be signed by one of them. Required when enabled.",
    )
    shadow_windows: int = Field(
        500, ge=10, description="Windows the candidate scores beside the active model (and "
        "windows watched after the swap).",
    )
    max_alert_rate_ratio: float = Field(
        2.0, ge=1.0, description="Candidate alert rate over the active one, at most (shadow and "
        "post-swap watch).",
    )
    alert_rate_floor: float = Field(
        0.01, gt=0.0, le=1.0, description="Reference alert rate used when the active model's is "
        "lower (one alert of a quiet model is not a regression).",
    )
    max_score_shift: float = Field(
        3.0, ge=1.0, description="Median and p95 of the candidate's scores over the active "
        "model's must lie within [1/x, x].",
    )
    acceptance_runs: int = Field(200, ge=10, description="Timed runs of one window (p99).")
    acceptance_p99_factor: float = Field(
        1.0, gt=0.0, description="p99 latency of one window must be at most the package's "
        "latency_budget_ms_p99 times this.",
    )
    notify_topic: str = Field(
        "models/notify", min_length=1, pattern=r"^[^+#]+$",
        description="MQTT topic suffix: a message on <topic_prefix>/<device_id>/<this> triggers "
        "an immediate check (needs [mqtt]).",
    )
    download_tries: int = Field(
        3, ge=1, description="Tries of an assignment whose archive differs from it (size, "
        "sha256) or cannot be written or installed (a full disk) before it is rejected.",
    )
    download_backoff_s: float = Field(
        60.0, gt=0.0, description="Seconds before downloading such an archive again (doubled "
        "after each further try, at most an hour).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> UpdaterConfig:
        if self.enabled and self.trusted_keys_dir is None:
            raise ValueError("trusted_keys_dir is required when the updater is enabled")
        if self.rollback_keys_dir is not None and self.rollback_keys_dir == self.trusted_keys_dir:
            raise ValueError("rollback_keys_dir must not be trusted_keys_dir: package and "
                             "rollback signers are separate trust sets")
        return self

    @property
    def limits(self) -> Limits:
        """The regression limits."""
        return Limits(self.max_alert_rate_ratio, self.max_score_shift, self.alert_rate_floor)


class ModelClient(Protocol):
    """What the updater needs from :class:`cloud_sync.client.FleetClient`."""

    def assignment(self, stream: str) -> ModelAssignment | None: ...

    def download(
        self, url_path: str, dest: Path, expected_size: int, expected_sha256: str,
        progress: Callable[[int, int], None] | None = None,
    ) -> Path: ...

    def report_status(self, report: ModelStatusReport) -> None: ...


@dataclass
class StreamHandle:
    """What the updater knows of one stream.

    Attributes:
        name: Stream name.
        slot: The handoff to the stream's pipeline thread.
        pipeline: Read only here: ``calibrating``, ``calibration_samples``, ``spec``.
        threshold_quantile: The stream's threshold quantile override, if any.
        installed: The active package's record when it came from the fleet, else None.
        previous: The previous package's record (None = the configured package).
    """

    name: str
    slot: ModelSlot
    pipeline: StreamPipeline
    threshold_quantile: float | None = None
    installed: Installed | None = None
    previous: Installed | None = None


class _Rejected(Exception):
    """A step refused the candidate (internal; the message is the reason)."""


class _Withdrawn(Exception):
    """The fleet stopped assigning the candidate before it became active (internal)."""


class Updater:
    """The update loop (see the module docstring).

    Args:
        config: ``[updater]``.
        client: Fleet client (assignment, download, report_status).
        store: Installed packages and ``active.json``.
        streams: Handles by stream name.
        device_id: This gateway (status reports; signed rollbacks must name it).
        trusted_keys: Package-signing keys by key id (never the rollback keys).
        metrics: ``model_updates_total``, ``model_version``, ``shadow_windows``.
        wrap_backend: Wraps a candidate's backend for a stream (inference timing).
        clock: Wall clock, epoch seconds UTC (report stamps).
        rng: Random source of the poll jitter.
        guard: Size and anti-rollback checks (default: marks in ``<store>/high_water.json``,
            no rollback keys: every rollback refused).
        abort: Cuts the client's requests in progress short (at stop); None = never.
    """

    def __init__(
        self,
        config: UpdaterConfig,
        client: ModelClient,
        store: ModelStore,
        streams: dict[str, StreamHandle],
        device_id: str,
        trusted_keys: TrustedKeys,
        metrics: Metrics,
        *,
        wrap_backend: Callable[[str, Backend], Backend] | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        guard: PackageGuard | None = None,
        abort: Callable[[], object] | None = None,
    ) -> None:
        self.config = config
        self._abort = abort
        self.client = client
        self.store = store
        self.streams = streams
        self.device_id = device_id
        self.trusted_keys = trusted_keys
        self.metrics = metrics
        self._wrap = wrap_backend
        self.clock = clock
        self._rng = rng if rng is not None else random.Random()
        self.stop_event = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsent: collections.deque[ModelStatusReport] = collections.deque(maxlen=UNSENT_LIMIT)
        #: Assignments refused per stream (not tried again unless the assignment changes).
        self._rejected: dict[str, set[tuple[str, str, str]]] = {n: set() for n in streams}
        self._fleet_failing = False
        self._retry = RetryBudget(config.download_tries, config.download_backoff_s)
        #: Per stream, the part file of its current download (the only ones kept).
        self._parts: dict[str, Path] = {}
        #: Per stream, ``(assignment key, most bytes a short download of it left)``.
        self._short: dict[str, tuple[tuple[str, str, str], int]] = {}
        self._announced = False
        self.guard = guard if guard is not None else PackageGuard(
            HighWater(store.root / HIGH_WATER_FILE), None, device_id, config.max_archive_bytes,
            clock,
        )
        #: Digests of assignments that failed the schema, per stream (reported once).
        self._invalid: dict[str, set[str]] = {n: set() for n in streams}
        for name, h in streams.items():
            self.metrics.model_version.labels(stream=name).set(h.slot.package.manifest.version)
            self.metrics.shadow_windows.labels(stream=name).set(0)
            for rec in (h.previous, h.installed):
                if rec is not None:
                    self.guard.high_water.ran(name, rec.name, rec.version)
            m = h.slot.package.manifest
            self.guard.high_water.ran(name, m.name, m.version)

    # -- thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the ``model-updater`` thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="model-updater", daemon=True)
            self._thread.start()

    def notify(self, _payload: bytes = b"") -> None:
        """Check for an update now (MQTT notify callback; any thread)."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the loop (an update in progress is abandoned: after ``timeout`` seconds its
        request is cut short, a download keeps its part file); True when it ended in time."""
        self.stop_event.set()
        self._wake.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive() and self._abort is not None:
            self._abort()
            self._thread.join(2.0)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            self.run_once()
            j = self._rng.uniform(-0.1, 0.1)
            self._wake.wait(self.config.poll_interval_s * (1.0 + j))
            self._wake.clear()

    def run_once(self) -> None:
        """One pass over every stream; never raises for fleet, package or model failures."""
        if not self._announced:
            self._announced = True
            for h in self.streams.values():
                self._unsent.append(running_report(self.device_id, h.name, h.slot.package,
                                                   h.installed is not None, self.clock()))
        self._flush_reports()
        for h in self.streams.values():
            if self.stop_event.is_set():
                return
            try:
                self.check_stream(h)
            except Exception:  # the loop must survive anything; the active model is untouched
                log.exception("stream %s: model update check failed", h.name,
                              extra={"stream": h.name})

    # -- one stream -----------------------------------------------------------------------------

    def check_stream(self, h: StreamHandle) -> None:
        """Handle a run-time fallback, then apply the stream's assignment if it is new."""
        self._after_failure(h)
        if h.pipeline.calibrating:
            return  # the candidate calibrates on the stream's calibration samples: wait
        try:
            a = self.client.assignment(h.name)
        except AssignmentInvalid as exc:
            self._fleet_ok()
            self._refuse_invalid(h, exc)
            return
        except FleetError as exc:
            self._fleet_trouble(f"assignment poll failed: {exc}")
            return
        self._fleet_ok()
        if a is None or a.stream not in (None, h.name):
            self._keep_part(h, None)
            return
        m = h.slot.package.manifest
        label = f"{a.name}@{a.version}"
        if (a.name, a.version) == (m.name, m.version) or label in self.store.refused(h.name):
            self._keep_part(h, None)
            return
        if _key(a) in self._rejected[h.name] or not self._retry.ready(_key(a)):
            return
        self._update(h, a)

    def _update(self, h: StreamHandle, a: ModelAssignment) -> None:
        m = h.slot.package.manifest
        refused = self.guard.before_download(a, h.name, (m.name, m.version))
        if refused is not None:
            self._reject(h, a, refused)
            return
        archive = self.store.incoming / f"{a.name}-{a.version}.tar.gz"
        self._keep_part(h, archive.with_suffix(".part"))
        try:
            self.client.download(a.url, archive, a.archive_size, a.archive_sha256)
        except FleetRejected as exc:
            if isinstance(exc, FleetAuthError):
                self._fleet_trouble(f"package download refused: {exc}")
            else:
                self._reject(h, a, f"download refused: {exc}")
            return
        except FleetProtocolError as exc:  # the archive arrived wrong
            self._failed_try(h, a, "download failed its check", exc)
            return
        except FleetDownloadShort as exc:
            self._ended_short(h, a, archive.with_suffix(".part"), exc)
            return
        except FleetError as exc:
            log.warning("stream %s: download of %s@%d interrupted (%s); resuming later",
                        h.name, a.name, a.version, exc, extra=_fields(h, a))
            return
        except OSError as exc:  # the state dir: full, read-only
            self._failed_try(h, a, "download could not be written", exc)
            return
        self._report(h, a, "downloaded", details={"bytes": a.archive_size})
        final: Path | None = None
        try:
            final = self._verify_and_install(h, a, archive)
            self._report(h, a, "verified")
            package, detector = self._accept(h, a, final)
            self._shadow_then_swap(h, a, package, detector)
        except (_Rejected, _Withdrawn, OSError) as exc:
            if isinstance(exc, _Withdrawn):
                log.warning("stream %s: %s; candidate dropped, the active model stays",
                            h.name, exc, extra=_fields(h, a))
            elif isinstance(exc, OSError):
                shutil.rmtree(self.store.incoming / f"{a.name}-{a.version}", ignore_errors=True)
                self._failed_try(h, a, "install failed", exc)
            else:
                self._reject(h, a, str(exc))
            if final is not None and final not in (_path(h.installed), _path(h.previous)):
                shutil.rmtree(final, ignore_errors=True)

    def _keep_part(self, h: StreamHandle, part: Path | None) -> None:
        """``part`` is ``h``'s current download (None: none); delete every other stream's
        stale part file in ``incoming/`` (a fleet that assigns a new name at every poll must
        not fill the disk with partial downloads)."""
        if part is None:
            self._parts.pop(h.name, None)
        else:
            self._parts[h.name] = part
        for gone in self.store.drop_parts(set(self._parts.values())):
            log.info("stream %s: partial download %s deleted (no longer assigned)", h.name,
                     gone.name)

    def _ended_short(
        self, h: StreamHandle, a: ModelAssignment, part: Path, exc: FleetError
    ) -> None:
        """A download ended before the announced size: resumed later when it brought new bytes,
        a failed try (backoff, then rejected and reported) when it did not."""
        size = part.stat().st_size if part.exists() else 0
        key, best = self._short.get(h.name, (None, -1))
        if key != _key(a) or size > best:
            self._short[h.name] = (_key(a), size)
            log.warning("stream %s: download of %s@%d interrupted (%s); resuming later",
                        h.name, a.name, a.version, exc, extra=_fields(h, a))
            return
        self._failed_try(h, a, "download ended short again without a new byte", exc)

    def _failed_try(self, h: StreamHandle, a: ModelAssignment, what: str, exc: Exception) -> None:
        """A try of ``a`` failed (a wrong archive, a full disk): tried again after the backoff,
        rejected with the reason once ``download_tries`` are spent."""
        wait = self._retry.failed(_key(a))
        if wait is None:
            archive = self.store.incoming / f"{a.name}-{a.version}.tar.gz"
            archive.with_suffix(".part").unlink(missing_ok=True)  # room on a full disk
            self._reject(h, a, f"{what} {self.config.download_tries} times: {exc}")
        else:
            log.warning("stream %s: model %s@%d: %s (%s); trying again in %.0f s",
                        h.name, a.name, a.version, what, exc, wait, extra=_fields(h, a))

    def _verify_and_install(self, h: StreamHandle, a: ModelAssignment, archive: Path) -> Path:
        unpacked = self.store.incoming / f"{a.name}-{a.version}"
        shutil.rmtree(unpacked, ignore_errors=True)
        m = h.slot.package.manifest
        try:
            unpack_verified(
                archive, unpacked, self.trusted_keys, max_bytes=self.config.max_package_bytes,
                check=lambda got: self.guard.check(h.name, (m.name, m.version), a, got),
            )
        except PackageError as exc:
            shutil.rmtree(unpacked, ignore_errors=True)
            raise _Rejected(f"{type(exc).__name__}: {exc}") from exc
        finally:
            archive.unlink(missing_ok=True)
        return self.store.install(unpacked, a.name, a.version)

    def _accept(
        self, h: StreamHandle, a: ModelAssignment, final: Path
    ) -> tuple[ModelPackage, FeatureDeviationDetector]:
        spec = h.pipeline.spec
        try:
            package = load_package(final)
            backend, details = acceptance_test(
                package, self.config.acceptance_runs, self.config.acceptance_p99_factor
            )
            cand = package.detector_spec(
                hop=spec.hop, calibration_samples=spec.calibration_samples,
                threshold_quantile=h.threshold_quantile,
            )
            # as the stream's detector: windows outside the INT8 input range score in FP32
            fallback, input_range = saturation_fallback(
                package, package.artefact("onnxruntime", "int8"))
            adaptation = package.adaptation()
        except ModelError as exc:
            raise _Rejected(f"acceptance failed: {exc}") from exc
        if cand.channels != spec.channels or cand.window != spec.window:
            raise _Rejected(f"channels/window {cand.channels}/{cand.window} differ from the "
                            f"stream's {spec.channels}/{spec.window}")
        if self._wrap is not None:
            backend = self._wrap(h.name, backend)
        self._report(h, a, "accepted", details=details)
        return package, build_detector(cand, backend, package.univariate_params(),
                                       fallback=fallback, input_range=input_range,
                                       adaptation=adaptation)

    def _shadow_then_swap(
        self, h: StreamHandle, a: ModelAssignment, package: ModelPackage,
        detector: FeatureDeviationDetector,
    ) -> None:
        calibration = self._calibration(h, package, detector)
        limits = self.config.limits
        shadow = ShadowRun(self.config.shadow_windows, (detector, calibration))
        self._report(h, a, "shadow", details={"threshold": calibration.threshold})
        h.slot.post(Observe(shadow))
        finished = self._wait(shadow.done, lambda: shadow.count, h.name)
        detach = Observe(None)
        h.slot.post(detach)
        shadow.release()
        if not finished:
            return  # stopping; nothing changed
        reason, details = shadow.verdict(limits)
        if reason is not None:
            raise _Rejected(reason)
        self._still_assigned(h, a)
        swap = Swap(package, detector, calibration, watch_windows=self.config.shadow_windows)
        h.slot.post(swap)
        if not self._wait(swap.applied, None, h.name):
            h.slot.withdraw(swap)
            return
        if swap.error is not None:
            raise _Rejected(f"swap refused: {swap.error}")
        new = Installed(a.name, a.version, str(package.path))
        self.guard.installed(h.name, a)  # the rollback mark only from a signed rollback
        h.previous, h.installed = h.installed, new
        self.store.set_active(h.name, new, h.previous)
        self._report(h, a, "active", details=details)
        if swap.watch is not None:
            self._watch(h, a, swap.watch)
        self.store.prune({p for p in (_path(h.installed), _path(h.previous)) if p})

    def _still_assigned(self, h: StreamHandle, a: ModelAssignment) -> None:
        """Ask the fleet again before the swap: a rollout aborted, paused or halted during the
        shadow run no longer assigns ``a`` (the fleet answers the running version or 204).

        Raises:
            _Withdrawn: the fleet now assigns something else (or nothing). A failed poll keeps
                the candidate (the fleet may be unreachable; the shadow verdict stands).
        """
        try:
            now = self.client.assignment(h.name)
        except AssignmentInvalid:
            return
        except FleetError:
            return
        if now is None or (now.name, now.version) != (a.name, a.version):
            got = "nothing" if now is None else f"{now.name}@{now.version}"
            raise _Withdrawn(f"the fleet no longer assigns {a.name}@{a.version} (now {got}: "
                             "rollout aborted, paused or halted)")

    def _calibration(
        self, h: StreamHandle, package: ModelPackage, detector: FeatureDeviationDetector
    ) -> Calibration:
        """The package's cloud-fitted calibration for this device/stream, else one fitted on the
        stream's own calibration samples."""
        preset, fitted = package.preset_calibration(), package.manifest.calibration
        if preset is not None and fitted is not None and (
            fitted.fitted_on.device_id, fitted.fitted_on.stream
        ) == (self.device_id, h.name):
            return preset
        samples = h.pipeline.calibration_samples
        if samples is None:
            raise _Rejected("the stream kept no calibration samples to calibrate the candidate")
        try:
            return detector.calibrate(samples)
        except (ModelError, ValueError) as exc:
            raise _Rejected(f"calibration of the candidate failed: {exc}") from exc

    def _watch(self, h: StreamHandle, a: ModelAssignment, watch: ShadowRun) -> None:
        while not (watch.done.is_set() or h.slot.failed.is_set() or self.stop_event.is_set()):
            watch.done.wait(_WAIT_STEP_S)
        if h.slot.failed.is_set() or not watch.done.is_set():
            return  # a run-time fallback (handled next pass) or stopping
        reason, details = watch.watch_verdict(self.config.limits)
        watch.release()
        h.slot.post(Observe(None))
        if reason is None:
            return
        rollback = Rollback()
        h.slot.post(rollback)
        if self._wait(rollback.applied, None, h.name) and rollback.error is None:
            self._rolled_back(h, a.name, a.version, a.rollout_id, reason, dict(details))

    def _after_failure(self, h: StreamHandle) -> None:
        """The pipeline fell back from a failing new model: record and report the rollback."""
        if not h.slot.failed.is_set():
            return
        h.slot.failed.clear()
        bad = h.installed
        if bad is None:
            return
        self._rolled_back(h, bad.name, bad.version, None,
                          f"model failed at run time: {h.slot.failure}", {})

    def _rolled_back(
        self, h: StreamHandle, name: str, version: int, rollout_id: int | None, reason: str,
        details: dict[str, float | int | str | None],
    ) -> None:
        bad = f"{name}@{version}"
        h.installed, h.previous = h.previous, None
        self.store.set_active(h.name, h.installed, None, refuse=bad)
        self._send(h, name, version, rollout_id, "rolled_back", reason, details)

    # -- helpers --------------------------------------------------------------------------------

    def _wait(
        self, event: threading.Event, progress: Callable[[], int] | None, stream: str
    ) -> bool:
        gauge = self.metrics.shadow_windows.labels(stream=stream)
        while not event.wait(_WAIT_STEP_S):
            if progress is not None:
                gauge.set(progress())
            if self.stop_event.is_set():
                return False
        if progress is not None:
            gauge.set(0)
        return True

    def _refuse_invalid(self, h: StreamHandle, exc: AssignmentInvalid) -> None:
        """Report an assignment that failed the schema as ``rejected``, once per content."""
        digest = hashlib.sha256(exc.raw).hexdigest()
        if digest in self._invalid[h.name]:
            return
        if len(self._invalid[h.name]) >= UNSENT_LIMIT:  # a fleet varying its answers: bounded
            self._invalid[h.name].clear()
        self._invalid[h.name].add(digest)
        name, version, rollout_id = salvage(exc.raw)
        self._send(h, name, version, rollout_id, "rejected", f"assignment refused: {exc}", {})

    def _reject(self, h: StreamHandle, a: ModelAssignment, reason: str) -> None:
        self._rejected[h.name].add(_key(a))
        self._report(h, a, "rejected", reason=reason)

    def _report(
        self, h: StreamHandle, a: ModelAssignment, state: ModelState, reason: str | None = None,
        details: dict[str, float] | dict[str, int] | None = None,
    ) -> None:
        self._send(h, a.name, a.version, a.rollout_id, state, reason, dict(details or {}))

    def _send(
        self, h: StreamHandle, name: str, version: int, rollout_id: int | None,
        state: ModelState, reason: str | None, details: dict[str, float | int | str | None],
    ) -> None:
        level = logging.WARNING if state in ("rejected", "rolled_back") else logging.INFO
        log.log(level, "stream %s: model %s@%d %s%s", h.name, name, version, state,
                f": {reason}" if reason else "",
                extra={"stream": h.name, "model": name, "model_version": version,
                       "rollout_id": rollout_id, "state": state})
        self.metrics.model_updates_total.labels(stream=h.name, state=state).inc()
        self.metrics.model_version.labels(stream=h.name).set(h.slot.package.manifest.version)
        report = ModelStatusReport(
            device_id=self.device_id, stream=h.name, name=name, version=version,
            rollout_id=rollout_id, state=state, reason=reason[:2000] if reason else None,
            details=details, at=self.clock(),
        )
        self._unsent.append(report)
        self._flush_reports()

    def _flush_reports(self) -> None:
        while self._unsent:
            try:
                self.client.report_status(self._unsent[0])
            except FleetAuthError as exc:
                self._fleet_trouble(f"status report refused (kept for a retry): {exc}")
                return
            except FleetRejected as exc:
                log.warning("fleet refused a model status report (dropped): %s", exc)
            except FleetError as exc:
                self._fleet_trouble(f"status report failed (kept for a retry): {exc}")
                return
            self._unsent.popleft()

    def _fleet_trouble(self, message: str) -> None:
        if not self._fleet_failing:
            log.warning("model updater: %s", message)
        self._fleet_failing = True

    def _fleet_ok(self) -> None:
        if self._fleet_failing:
            log.info("model updater: fleet reachable again")
        self._fleet_failing = False


def _key(a: ModelAssignment) -> tuple[str, str, str]:
    """Identity of an assignment for "already refused": package, archive and rollback."""
    return (f"{a.name}@{a.version}", a.archive_sha256, a.rollback.signature if a.rollback else "")


def _path(rec: Installed | None) -> Path | None:
    return Path(rec.path) if rec is not None else None


def _fields(h: StreamHandle, a: ModelAssignment) -> dict[str, object]:
    """The structured log fields of one stream's assignment (JSON logs: agent.logs)."""
    return {"stream": h.name, "model": a.name, "model_version": a.version,
            "rollout_id": a.rollout_id}
