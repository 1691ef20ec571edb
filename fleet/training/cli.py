"""``edge-fleet retrain``: retrain one device stream's model from its uploaded samples.

::

    edge-fleet retrain --device D --stream S [--db URL] [--state-dir DIR]
                       --signing-key FILE --trusted-keys DIR [--base-model DIR]

Talks to the database directly (like ``device add``): reads the device's newest calibration
samples and reservoir windows, trains and quantizes with progress bars (tqdm, on stderr), gates,
signs with ``--signing-key`` (its public key must be in ``--trusted-keys``, which the registry
checks as for any upload), publishes the next version and creates a rollout for that device and
stream. Exit codes: 0 published, 1 refused (gated: the reasons and the retrained and base
models' held-out false-alarm rates are printed; no samples),
78 bad configuration (key files, base model).

Also builds the :class:`~fleet.training.retrain.Retrainer` of ``edge-fleet worker``
(:mod:`fleet.jobs.cli`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from fleet.db.samples import SampleStore
from fleet.errors import ConfigError
from fleet.registry.wiring import build_model_loop
from fleet.settings import Settings

if TYPE_CHECKING:
    from fleet.training.retrain import Retrainer

#: The package retrained models follow unless ``--base-model`` says otherwise.
DEFAULT_BASE_MODEL = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"

_log = logging.getLogger("fleet.training")


def add_arguments(parser: argparse.ArgumentParser, *, serve: bool, device: bool = True) -> None:
    """Add the retraining options to ``parser`` (``serve``; ``retrain``; ``worker`` with
    ``device=False``)."""
    if serve:
        parser.add_argument("--auto-retrain", action="store_true",
                            help="enqueue a retraining job when a device posts calibration "
                                 "samples (edge-fleet worker processes run the jobs)")
        parser.add_argument("--base-model", type=Path, default=DEFAULT_BASE_MODEL,
                            help=argparse.SUPPRESS)  # workers retrain now: accepted, unused
        return
    if device:
        parser.add_argument("--device", required=True, help="device id")
        parser.add_argument("--stream", required=True, help="stream name")
    parser.add_argument("--base-model", type=Path, default=DEFAULT_BASE_MODEL,
                        help="package the retrained model follows (input spec, floors, score)")


def _check(settings: Settings, base_model: Path) -> Path:
    if settings.signing_key_file is None:
        raise ConfigError("retraining needs the fleet's signing key (--signing-key)")
    if not (base_model / "manifest.json").is_file():
        raise ConfigError(f"base model {base_model} has no manifest.json")
    return settings.signing_key_file


def build_retrainer(settings: Settings, engine: Engine, base_model: Path) -> Retrainer:
    """The retrainer of ``edge-fleet worker`` (progress goes to the job, not to bars).

    Raises:
        ConfigError: no signing key, a key file or the base model cannot be loaded.
    """
    from fleet.training.retrain import Retrainer  # noqa: PLC0415 - onnx

    key = _check(settings, base_model)
    return Retrainer(SampleStore(engine), build_model_loop(settings, engine), key, base_model,
                     work_dir=settings.state_dir)


def run_retrain(args: argparse.Namespace, settings: Settings, engine: Engine) -> int:
    """``edge-fleet retrain``; returns the exit code (0 published, 1 refused).

    Raises:
        ConfigError: no signing key, a key file or the base model cannot be loaded.
    """
    from tqdm import tqdm  # noqa: PLC0415 - only the CLI draws bars

    from fleet.training.retrain import NoSamples, Retrainer  # noqa: PLC0415 - onnx
    from fleet.training.train import STEPS  # noqa: PLC0415

    key = _check(settings, args.base_model)
    steps = tqdm(total=len(STEPS), desc="retrain", unit="step")
    bars: dict[str, Any] = {}

    def on_step(name: str) -> None:
        if "quant" in bars:
            bars.pop("quant").close()
        steps.set_postfix_str(name)
        steps.update(0 if steps.n == 0 and name == STEPS[0] else 1)
        if name == "int8 quantization":
            bars["quant"] = tqdm(desc="int8 calibration batches", unit="batch", leave=False)

    def on_batch() -> None:
        if "quant" in bars:
            bars["quant"].update(1)

    retrainer = Retrainer(SampleStore(engine), build_model_loop(settings, engine), key,
                          args.base_model, work_dir=settings.state_dir, on_step=on_step,
                          on_quant_batch=on_batch)
    try:
        outcome = retrainer.retrain(args.device, args.stream)
    except NoSamples as exc:
        steps.close()
        print(f"edge-fleet: {exc}")
        return 1
    steps.update(steps.total - steps.n)
    steps.close()
    if not outcome.published:
        print(f"gated, not published: {outcome.name}@{outcome.version}: {outcome.reason}"
              + (f" ({outcome.figures()})" if outcome.figures() else ""))
        return 1
    g = outcome.gate
    assert g is not None
    print(f"published {outcome.name}@{outcome.version} for {args.device}/{args.stream}, rollout "
          f"{outcome.rollout_id}; gate on {g.heldout_windows} held-out windows "
          f"({g.heldout_source}): FAR {100 * g.false_alarm_rate:.1f} %, FP32/INT8 agreement "
          f"{100 * g.decision_agreement:.1f} %, max |delta| {g.max_abs_err:.3f}; "
          f"{outcome.figures()}")
    return 0
