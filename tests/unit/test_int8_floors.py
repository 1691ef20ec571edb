"""INT8 feature floors (fleet.training.wstat.feature_steps / quantization_floor) and the selection
helpers that hand choices to the package recipe (models/recipes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from cloud_sync.calibration import sliding_windows
from fleet.training.wstat import (
    build_graph,
    feature_steps,
    quantization_floor,
    quantize_int8,
    session_runner,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models" / "recipes"))


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A W 5, 3-channel INT8 model whose channel 2 varies 100 x less than the others."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3)) * np.array([1.0, 1.0, 0.01])
    win = sliding_windows(x.astype(np.float32), 5)
    d = tmp_path_factory.mktemp("int8")
    onnx.save(build_graph(5, 3), d / "fp32.onnx")
    quantize_int8(d / "fp32.onnx", d / "int8.onnx", win[:1000])
    return d / "int8.onnx", win


def test_feature_steps_are_the_quantize_scales_of_the_three_feature_tensors(
        int8_model: tuple[Path, np.ndarray]) -> None:
    path, _ = int8_model
    steps = feature_steps(path, 3)
    model = onnx.load(str(path))
    inits = {i.name: float(numpy_helper.to_array(i)) for i in model.graph.initializer
             if i.name.endswith("_scale")}
    assert steps.shape == (9,)
    for block, tensor in enumerate(("mean", "mean_abs_dev", "mad")):
        np.testing.assert_allclose(steps[3 * block:3 * block + 3], inits[f"{tensor}_scale"])
    assert (steps > 0).all()


def test_a_feature_below_one_step_gets_the_step_as_floor_and_int8_takes_few_values(
        int8_model: tuple[Path, np.ndarray]) -> None:
    """Channel 2's mean absolute deviation spreads over less than one INT8 step: INT8 rounds it to
    a handful of values, so its calibration std is the rounding's; the floor takes over."""
    path, win = int8_model
    steps = feature_steps(path, 3)
    feats = session_runner(path)(win[:400])
    mad_ch2 = feats[:, 3 + 2]
    assert len(np.unique(mad_ch2)) <= 5
    floor = quantization_floor(np.full(9, 1e-4), steps)
    assert floor[5] == steps[5] and floor[5] > mad_ch2.std()
    assert floor[3] == steps[3]  # every floor below the step is raised to it
    np.testing.assert_array_equal(quantization_floor(np.full(9, 10.0), steps), 10.0)


def test_selection_writes_each_groups_held_out_choice_for_the_recipe(tmp_path: Path,
                                                                    monkeypatch) -> None:
    import skab_select  # noqa: PLC0415 - a recipe, not a package
    from skab_select import Study, write_heldout  # noqa: PLC0415

    grid = {"wstat": {"window": (5,), "param": (1, 2), "holdout": (0.0,),
                      "factor": (1.0, 1.5, 2.0)}}
    monkeypatch.setattr(skab_select, "GRID", grid)
    rng = np.random.default_rng(0)
    files = {}
    for i, name in enumerate(("a/0", "a/1", "b/0", "b/1")):
        x = rng.normal(size=(600, 2))
        x[500:] += 4.0 + i
        lab = np.zeros(600, np.int8)
        lab[500:] = 1
        files[name] = (x, lab)
    study = Study(files, np.full(2, 0.05), {5: np.full(6, 0.05)}, ["wstat"])
    paths = write_heldout(study, "wstat", tmp_path / "heldout")
    assert sorted(p.name for p in paths) == ["a.json", "b.json"]
    lgo = study.leave_group_out("wstat")
    for g in ("a", "b"):
        got = json.loads((tmp_path / "heldout" / f"{g}.json").read_text())
        c = lgo[g][0]
        assert (got["window"], got["param"], got["factor"]) == (c.window, c.param, c.factor)
        assert got["held_out_group"] == g and g not in got["chosen_on"]


def test_package_recipe_requires_a_selection(tmp_path: Path) -> None:
    import skab_wstat  # noqa: PLC0415 - a recipe, not a package

    with pytest.raises(SystemExit) as info:
        skab_wstat.main(["--data", str(tmp_path), "--out", str(tmp_path / "pkg"), "--window",
                         "10"])
    assert info.value.code == 2  # argparse: --window is gone, --selection is required
    with pytest.raises(SystemExit):
        skab_wstat.main(["--data", str(tmp_path), "--out", str(tmp_path / "pkg")])
    assert not (tmp_path / "pkg").exists()
