"""Retrain one device stream's model and publish it: samples → train → gate → sign → registry →
rollout.

:class:`Retrainer` runs one retraining synchronously (``edge-fleet retrain``):

1. read the newest ``calibration`` sample batch of the device stream and its reservoir windows
   (:class:`fleet.db.samples.SampleStore`);
2. :func:`fleet.training.train.train_wstat` into a fresh directory (version = the registry's
   newest version of the base model's name + 1);
3. gate failed: log the reasons at WARNING and return a ``gated`` :class:`RetrainOutcome`
   (nothing signed, nothing stored), with the gate's figures: among them the retrained and
   the base model's false-alarm rates on the device's held-out windows (a retrained model
   worse than the base package on them is never published;
   :func:`fleet.training.train.train_wstat`, step 5);
4. sign the manifest with the fleet's signing key (:func:`cloud_sync.package.sign_package_dir`),
   pack it, and in ONE database transaction: add it to the registry (which verifies it against
   the trusted keys like any upload), create a rollout of that version targeting the device alone
   and that stream (so the device's updater picks it up as its candidate: acceptance, shadow,
   swap on the device), and call ``on_publish`` (a retraining job records its completion there,
   :mod:`fleet.jobs.worker`). Either all of it commits or none: a worker killed before the commit
   leaves no package behind, one killed after it leaves a finished job.

The automatic trigger (``edge-fleet serve --auto-retrain``) only enqueues a job
(:mod:`fleet.jobs.queue`); ``edge-fleet worker`` processes run them (:mod:`fleet.jobs.worker`).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection

from cloud_sync.package import pack, sign_package_dir
from fleet.api.model_loop import ModelLoop
from fleet.db.samples import SampleStore
from fleet.errors import Conflict, FleetError
from fleet.registry.views import RolloutCreate
from fleet.training.train import DeviceData, GateFailed, GateReport, TrainOptions, train_wstat

_log = logging.getLogger("fleet.training")

#: Called inside the publishing transaction with the outcome (published, rollout id set);
#: raising rolls the package and the rollout back.
OnPublish = Callable[[Connection, "RetrainOutcome"], None]


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
        version: Package version (also set when the gate refused it).
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
        versions = [r.version for r in self.loop.registry.list(self.name)]
        return max([self.base_version, *versions]) + 1

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
        for attempt in range(3):
            version = self._next_version()
            with tempfile.TemporaryDirectory(prefix="edge-fleet-train-", dir=self.work_dir) as t:
                pkg = Path(t) / f"{self.name}-{version}"
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
                sign_package_dir(pkg, self.signing_key)
                archive = Path(t) / "package.tar.gz"
                pack(pkg, archive)
                req = RolloutCreate(name=self.name, version=version, devices=[device_id],
                                    stream=stream)
                try:
                    with self.loop.registry.transaction() as conn:
                        self.loop.registry.add(archive.read_bytes(), "retrain", conn)
                        rollout_id = self.loop.rollouts.create_in(conn, req)
                        done = RetrainOutcome(device_id, stream, True, self.name, version,
                                              rollout_id, result.gate)
                        if on_publish is not None:
                            on_publish(conn, done)
                except Conflict:
                    if attempt == 2:
                        raise
                    continue  # someone published that version meanwhile: take the next
            _log.info("retrain %s/%s: published %s@%d (gate: FAR %.1f %%, agreement %.1f %%, "
                      "max |delta| %.3f; %s), rollout %d", device_id, stream, self.name,
                      version, 100 * result.gate.false_alarm_rate,
                      100 * result.gate.decision_agreement, result.gate.max_abs_err,
                      done.figures(), rollout_id)
            return done
        raise AssertionError("unreachable")  # pragma: no cover
