"""Concurrent retrainings of one model name publish distinct versions, each trained once: the
version is taken in the publishing transaction under the registry's lock on the name
(:meth:`fleet.registry.store.ModelRegistry.next_version`), not when the training starts. Real
training, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from cloud_sync.package import pack, sign_package_dir
from cloud_sync.protocol import INT64_MAX, SampleBatch
from fleet.db.model_tables import rollouts
from fleet.db.samples import SampleStore
from fleet.errors import Unprocessable
from fleet.registry.wiring import build_model_loop
from fleet.settings import Settings
from fleet.training.retrain import Retrainer, RetrainOutcome, _set_version
from tests.fleet.test_training import BASE, NEXT, _batch, _keys


@pytest.fixture
def retrainer(settings: Settings, engine: Engine, enrolled: dict[str, str],
              tmp_path: Path) -> Retrainer:
    """A retrainer of the base model; gw1 and gw2 have calibration samples on ``pump``."""
    key, keydir = _keys(tmp_path)
    keyed = dataclasses.replace(settings, trusted_keys_dir=keydir, signing_key_file=key)
    store = SampleStore(engine)
    for device in ("gw1", "gw2"):
        store.add(SampleBatch.model_validate(_batch(device)), dt.datetime.now(dt.timezone.utc))
    return Retrainer(store, build_model_loop(keyed, engine), key, BASE)


def _rollout_targets(engine: Engine) -> dict[int, list[str]]:
    """``{version: target devices}`` of every rollout."""
    with engine.connect() as conn:
        return {int(r.model_version): list(r.target_devices) for r in conn.execute(
            select(rollouts.c.model_version, rollouts.c.target_devices))}


def test_a_version_published_while_training_is_not_reused(
    retrainer: Retrainer, engine: Engine
) -> None:
    """Each time gw1's retraining has built its package, a retraining of gw2 (same model name)
    publishes first: gw1's is published under the next version, without training again."""
    steps: Counter[str] = Counter()
    others: list[RetrainOutcome] = []

    def on_step(name: str) -> None:
        steps[name] += 1
        if name == "manifest":  # trained and gated; numbered provisionally, not yet published
            others.append(retrainer.retrain("gw2", "pump"))

    mine = retrainer.retrain("gw1", "pump", on_step=on_step)
    assert steps["prepare"] == 1, steps  # trained once
    [other] = others
    assert (other.published, other.version) == (True, NEXT)
    assert (mine.published, mine.version) == (True, NEXT + 1)
    assert [r.version for r in retrainer.loop.registry.list("skab-wstat")] == [NEXT, NEXT + 1]
    fitted = retrainer.loop.registry.get("skab-wstat", NEXT + 1).manifest["calibration"]
    assert fitted["fitted_on"]["device_id"] == "gw1"
    assert _rollout_targets(engine) == {NEXT: ["gw2"], NEXT + 1: ["gw1"]}
    assert mine.rollout_id is not None and mine.rollout_id != other.rollout_id


def test_two_retrainings_publishing_at_once_get_distinct_versions(
    retrainer: Retrainer, engine: Engine
) -> None:
    """Two threads build their packages (both numbered NEXT provisionally), meet at a barrier,
    then publish at the same time: one gets NEXT, the other NEXT + 1, each trained once."""
    barrier = threading.Barrier(2, timeout=300)
    steps = {d: Counter[str]() for d in ("gw1", "gw2")}
    outcomes: dict[str, RetrainOutcome] = {}
    errors: list[BaseException] = []

    def run(device: str) -> None:
        def on_step(name: str) -> None:
            steps[device][name] += 1
            if name == "manifest" and steps[device][name] == 1:
                barrier.wait()

        try:
            outcomes[device] = retrainer.retrain(device, "pump", on_step=on_step)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(d,)) for d in ("gw1", "gw2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert {d: s["prepare"] for d, s in steps.items()} == {"gw1": 1, "gw2": 1}
    assert all(o.published for o in outcomes.values())
    versions = {d: o.version for d, o in outcomes.items()}
    assert sorted(versions.values()) == [NEXT, NEXT + 1]
    assert [r.version for r in retrainer.loop.registry.list("skab-wstat")] == [NEXT, NEXT + 1]
    for device, version in versions.items():
        rec = retrainer.loop.registry.get("skab-wstat", version)
        assert rec.manifest["calibration"]["fitted_on"]["device_id"] == device
    assert _rollout_targets(engine) == {v: [d] for d, v in versions.items()}


def test_a_name_at_the_largest_version_is_refused_before_training(
    retrainer: Retrainer, tmp_path: Path
) -> None:
    """An operator's package at the largest storable version (2**63 - 1): a retraining of that
    name has no version left; it is refused with that reason before it trains."""
    pkg = tmp_path / "top"
    shutil.copytree(BASE, pkg)
    _set_version(pkg, INT64_MAX)
    sign_package_dir(pkg, retrainer.signing_key)
    pack(pkg, tmp_path / "top.tar.gz")
    retrainer.loop.registry.add((tmp_path / "top.tar.gz").read_bytes(), "operator")
    steps: Counter[str] = Counter()
    with pytest.raises(Unprocessable, match="no version is left"):
        retrainer.retrain("gw1", "pump", on_step=lambda name: steps.update([name]))
    assert steps["prepare"] == 0  # not trained for nothing
    assert [r.version for r in retrainer.loop.registry.list("skab-wstat")] == [INT64_MAX]
