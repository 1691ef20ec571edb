"""Retrain one device stream's model and publish it: samples → train → gate → sign → registry →
rollout.

:class:`Retrainer` runs one retraining synchronously (``edge-fleet retrain``):

1. read the newest ``calibration`` sample batch of the device stream and its reservoir windows
   (:class:`fleet.db.samples.SampleStore`);
2. :func:`fleet.training.train.train_wstat` into a fresh directory, numbered provisionally (the
   registry's newest version of the base model's name + 1, at least the base's + 1);
3. gate failed: log the reasons at WARNING and return a ``gated`` :class:`RetrainOutcome`
   (nothing signed, nothing stored), with the gate's figures: among them the retrained and
   the base model's false-alarm rates on the device's held-out windows (a retrained model
   worse than the base package on them is never published;
   :func:`fleet.training.train.train_wstat`, step 5);
4. publish in ONE database transaction: take the registry's lock on the name and the next free
   version under it (:meth:`fleet.registry.store.ModelRegistry.next_version`; a retraining
   published by another worker while this one trained is seen there), write that version into
   the manifest, sign it with the fleet's signing key (:func:`cloud_sync.package.sign_package_dir`)
   and pack it, add it to the registry (which verifies it against the trusted keys like any
   upload), create a rollout of that version targeting the device alone and that stream (so the
   device's updater picks it up as its candidate: acceptance, shadow, swap on the device), and
   call ``on_publish`` (a retraining job records its completion there, :mod:`fleet.jobs.worker`).
   Either all of it commits or none: a worker killed before the commit leaves no package
   behind, one killed after it leaves a finished job. Concurrent retrainings of one name
   publish one after the other with distinct versions, each trained once; should the version
   still be taken at insert time (a writer that does not take the lock), the package is
   renumbered and published again, up to :data:`PUBLISH_ATTEMPTS` times, without retraining.

The automatic trigger (``edge-fleet serve --auto-retrain``) only enqueues a job
(:mod:`fleet.jobs.queue`); ``edge-fleet worker`` processes run them (:mod:`fleet.jobs.worker`).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from sqlalchemy import Connection

from cloud_sync.package import MANIFEST, pack, sign_package_dir
from fleet.api.model_loop import ModelLoop
from fleet.db.samples import SampleStore
from fleet.errors import Conflict, FleetError
from fleet.registry.store import version_above
from fleet.registry.views import RolloutCreate
from fleet.training.train import DeviceData, GateFailed, GateReport, TrainOptions, train_wstat

_log = logging.getLogger("fleet.training")

#: Called inside the publishing transaction with the outcome (published, rollout id set);
#: raising rolls the package and the rollout back.
OnPublish = Callable[[Connection, "RetrainOutcome"], None]
#: Publishing transactions tried per retraining before its Conflict is raised.
PUBLISH_ATTEMPTS = 3


class NoSamples(FleetError):
    """The device stream has no calibration samples to train on."""


@dataclass(frozen=True)
class RetrainOutcome:
    """What one retraining did.

    Attributes:
        device_id: The device.
        stream: Its stream.
        published: The package passed its gate and is in the registry with a rollout.
        name: Package name.
        version: Package version: the one stored when published; the build's provisional
            number when the gate refused it.
        rollout_id: The rollout created, when published.
        gate: The gate's measurements.
        reason: Why it was not published (None when published).
    """

    device_id: str
    stream: str
    published: bool
    name: str
    version: int
    rollout_id: int | None
    gate: GateReport | None
    reason: str | None = None

    @property
    def status(self) -> str:
        """``published``, or ``gated`` (refused by its gate; :attr:`reason` says why)."""
        return "published" if self.published else "gated"

    def figures(self) -> str:
        """The base comparison's two false-alarm rates, e.g. ``"held-out false-alarm rate
        retrained 16.7 %, base 11.5 % (96 windows, calibration tail)"``; '' without a gate."""
        g = self.gate
        if g is None or not g.compare_windows:
            return ""
        return (f"held-out false-alarm rate retrained {100 * g.retrained_false_alarm_rate:.1f} %, "
                f"base {100 * g.base_false_alarm_rate:.1f} % ({g.compare_windows} windows, "
                f"{g.compare_source})")


class Retrainer:
    """Retrain and publish one device stream's model.

    Args:
        samples: Where the devices' samples are.
        loop: Registry and rollouts.
        signing_key: ``<key_id>.key`` of the fleet (its public key must be trusted).
        base_package_dir: Package whose input spec, floors and score the retrained one follows.
        work_dir: Parent of the temporary build directories (None: the system's temp dir).
        options: Training and gate knobs.
        on_step: Progress callback per training step (the CLI's tqdm bar).
        on_quant_batch: Progress callback per quantization batch.
    """

    def __init__(
        self,
        samples: SampleStore,
        loop: ModelLoop,
        signing_key: Path,
        base_package_dir: Path,
        *,
        work_dir: Path | None = None,
        options: TrainOptions | None = None,
        on_step: Callable[[str], None] | None = None,
        on_quant_batch: Callable[[], None] | None = None,
    ) -> None:
        self.samples = samples
        self.loop = loop
        self.signing_key = signing_key
        self.base_package_dir = base_package_dir
        self.work_dir = work_dir
        self.options = options or TrainOptions()
        self.on_step = on_step
        self.on_quant_batch = on_quant_batch
        base = json.loads((base_package_dir / "manifest.json").read_text(encoding="utf-8"))
        self.name: str = base["name"]
        self.base_version: int = int(base["version"])

    def has_device_model(self, device_id: str, stream: str) -> bool:
        """True when the registry holds a package fitted for this device and stream."""
        for rec in self.loop.registry.list(self.name):
            fitted = (rec.manifest.get("calibration") or {}).get("fitted_on") or {}
            if fitted.get("device_id") == device_id and fitted.get("stream") == stream:
                return True
        return False

    def _next_version(self) -> int:
        """The build's provisional number (the published one is taken at publication)."""
        versions = [r.version for r in self.loop.registry.list(self.name)]
        return version_above(self.name, max([self.base_version, *versions]))

    def retrain(
        self,
        device_id: str,
        stream: str,
        *,
        on_step: Callable[[str], None] | None = None,
        on_quant_batch: Callable[[], None] | None = None,
        on_publish: OnPublish | None = None,
    ) -> RetrainOutcome:
        """Train, gate, sign, publish and roll out (see the module docstring).

        Args:
            device_id: The device.
            stream: Its stream.
            on_step: Progress per training step (instead of the constructor's).
            on_quant_batch: Progress per quantization batch (instead of the constructor's).
            on_publish: Called inside the publishing transaction (module docstring, step 4).

        Raises:
            NoSamples: no calibration samples for this device stream.
            ValueError: the samples do not fit the base model (channels, length).
            fleet.errors.ApiError: the registry or rollout refused (e.g. untrusted key).
            Exception: whatever a callback raised (nothing is published then).
        """
        on_step = on_step or self.on_step
        on_quant_batch = on_quant_batch or self.on_quant_batch
        cal = self.samples.latest_calibration(device_id, stream)
        if cal is None:
            raise NoSamples(f"no calibration samples from {device_id}/{stream}")
        reservoir = self.samples.reservoir(device_id, stream, cal.channels)
        data = DeviceData(
            device_id=device_id, stream=stream, channels=cal.channels,
            samples=cal.windows[0], reservoir=reservoir, sample_rate_hz=cal.sample_rate_hz,
        )
        if self.work_dir is not None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
        version = self._next_version()
        with tempfile.TemporaryDirectory(prefix="edge-fleet-train-", dir=self.work_dir) as t:
            pkg = Path(t) / "package"
            try:
                result = train_wstat(
                    data, self.base_package_dir, pkg, name=self.name, version=version,
                    options=self.options, on_step=on_step, on_quant_batch=on_quant_batch,
                )
            except GateFailed as exc:
                gated = RetrainOutcome(device_id, stream, False, self.name, version, None,
                                       exc.report, str(exc))
                _log.warning("retrain %s/%s: %s@%d not published (gated; %s): %s",
                             device_id, stream, self.name, version, gated.figures(), exc)
                return gated
            done = self._publish(pkg, Path(t) / "package.tar.gz",
                                 RetrainOutcome(device_id, stream, True, self.name, version,
                                                None, result.gate), on_publish)
        _log.info("retrain %s/%s: published %s@%d (gate: FAR %.1f %%, agreement %.1f %%, "
                  "max |delta| %.3f; %s), rollout %s", device_id, stream, self.name,
                  done.version, 100 * result.gate.false_alarm_rate,
                  100 * result.gate.decision_agreement, result.gate.max_abs_err,
                  done.figures(), done.rollout_id)
        return done

    def _publish(self, pkg: Path, archive: Path, built: RetrainOutcome,
                 on_publish: OnPublish | None) -> RetrainOutcome:
        """Number, sign, pack, store and roll out ``pkg`` in one transaction (module docstring,
        step 4); ``built`` is the outcome with the provisional version and no rollout yet.

        Raises:
            Conflict: the version was taken at insert time on each of :data:`PUBLISH_ATTEMPTS`.
        """
        registry = self.loop.registry
        for attempt in range(PUBLISH_ATTEMPTS):
            try:
                with registry.transaction() as conn:
                    version = registry.next_version(self.name, conn, above=self.base_version)
                    _set_version(pkg, version)
                    sign_package_dir(pkg, self.signing_key)
                    pack(pkg, archive)
                    registry.add(archive.read_bytes(), "retrain", conn)
                    rollout_id = self.loop.rollouts.create_in(conn, RolloutCreate(
                        name=self.name, version=version, devices=[built.device_id],
                        stream=built.stream))
                    done = replace(built, version=version, rollout_id=rollout_id)
                    if on_publish is not None:
                        on_publish(conn, done)
                return done
            except Conflict:
                if attempt == PUBLISH_ATTEMPTS - 1:
                    raise
                _log.warning("retrain %s/%s: %s@%d was taken meanwhile; renumbering",
                             built.device_id, built.stream, self.name, version)
        raise AssertionError("unreachable")  # pragma: no cover


def _set_version(pkg: Path, version: int) -> None:
    """Write ``version`` into the package directory's (unsigned or signed) manifest; the
    signature no longer matches until :func:`cloud_sync.package.sign_package_dir`."""
    path = pkg / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["version"] = version
    manifest["signature"] = None
    path.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
