"""Lookup order of ``builtin:<name>`` model packages (agent.config.builtin_models)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import cli
from agent.config import builtin_models
from agent.config.builtin_models import (
    MODELS_DIR_ENV,
    available_builtins,
    builtin_candidates,
    find_builtin,
    not_found_problem,
)
from agent.config.schema import AgentConfig, resolve_model_path
from agent.preflight import preflight


def _package(root: Path, name: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "manifest.json").write_text("{}")
    return root / name


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A fake checkout ``models/`` and a fake wheel ``agent/builtin_models``, both empty."""
    checkout, wheel = tmp_path / "checkout" / "models", tmp_path / "site" / "builtin_models"
    checkout.mkdir(parents=True)
    wheel.mkdir(parents=True)
    monkeypatch.delenv(MODELS_DIR_ENV, raising=False)
    monkeypatch.setattr(builtin_models, "CHECKOUT_MODELS_DIR", checkout)
    monkeypatch.setattr(builtin_models, "package_models_dir", lambda: wheel)
    return checkout, wheel


def test_checkout_wins_over_the_wheel(roots: tuple[Path, Path]) -> None:
    checkout, wheel = roots
    _package(wheel, "m")
    assert find_builtin("m") == wheel / "m"
    assert find_builtin("m") == resolve_model_path("builtin:m", Path("/etc"))
    _package(checkout, "m")
    assert find_builtin("m") == checkout / "m"


def test_installed_without_checkout(roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
                                    ) -> None:
    checkout, wheel = roots
    checkout.rmdir()
    _package(wheel, "m")
    assert builtin_candidates("m") == [wheel / "m"]
    assert find_builtin("m") == wheel / "m"
    assert find_builtin("absent") == wheel / "absent"
    monkeypatch.setattr(builtin_models, "package_models_dir", lambda: None)
    assert find_builtin("m") == checkout / "m"  # nowhere: the loader reports this path


def test_env_dir_comes_first(roots: tuple[Path, Path], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    checkout, wheel = roots
    _package(checkout, "m")
    _package(wheel, "w")
    opt = tmp_path / "opt"
    monkeypatch.setenv(MODELS_DIR_ENV, str(opt))
    assert find_builtin("m") == checkout / "m"  # not in the variable's directory: next one
    assert find_builtin("absent") == opt / "absent"
    _package(opt, "m")
    assert find_builtin("m") == opt / "m"
    assert available_builtins() == {"m": opt / "m", "w": wheel / "w"}


def test_models_command(roots: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    checkout, wheel = roots
    assert cli.main(["models"]) == 1
    assert "no builtin model packages" in capsys.readouterr().err
    (_package(wheel, "m") / "manifest.json").write_text('{"version": 3, "kind": "sensor"}')
    (_package(checkout, "bad") / "manifest.json").write_text("[")
    assert cli.main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("builtin:bad  unreadable manifest (")
    assert lines[0].endswith(str(checkout / "bad"))
    assert lines[1] == f"builtin:m  version 3  sensor  {wheel / 'm'}"
    assert lines[2].startswith("builtin:mtd-patchcore  not found: builtin:mtd-patchcore is not in "
                               "the wheel: copy models/mtd-patchcore from a checkout")
    assert f"set {MODELS_DIR_ENV}=DIR" in lines[2]


def test_models_command_lists_the_image_model_a_wheel_lacks(
        roots: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A wheel install: the shipped packages found, mtd-patchcore named with how to get it."""
    checkout, wheel = roots
    checkout.rmdir()
    for name in builtin_models.SHIPPED_IN_WHEEL:
        _package(wheel, name)
    assert cli.main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [
        "builtin:skab-wstat", "builtin:univariate-wstat", "builtin:mtd-patchcore"]
    assert lines[-1] == (
        "builtin:mtd-patchcore  not found: builtin:mtd-patchcore is not in the wheel: copy "
        "models/mtd-patchcore from a checkout into a directory DIR and set "
        "EDGE_AGENT_MODELS_DIR=DIR, or give the package directory's path as the stream's model "
        "(docs/install.md)")


def test_available_builtins_lists_both(roots: tuple[Path, Path]) -> None:
    checkout, wheel = roots
    _package(checkout, "a")
    _package(wheel, "a")
    _package(wheel, "b")
    (wheel / "not-a-package").mkdir()
    assert available_builtins() == {"a": checkout / "a", "b": wheel / "b"}


def test_checkout_has_no_package_data() -> None:
    """In a checkout the packages are read from models/, never from agent/builtin_models."""
    assert builtin_models.package_models_dir() is None
    assert find_builtin("skab-wstat") == builtin_models.CHECKOUT_MODELS_DIR / "skab-wstat"


def test_missing_builtin_names_the_packages_there(roots: tuple[Path, Path], tmp_path: Path
                                                  ) -> None:
    """check-config (preflight) on a builtin the install lacks: where it looked, what there is."""
    checkout, wheel = roots
    checkout.rmdir()
    _package(wheel, "skab-wstat")
    config = AgentConfig.model_validate({"streams": [{
        "name": "tiles", "model": "builtin:mtd-patchcore",
        "source": {"kind": "camera", "folder": str(tmp_path)}}]}).resolved(tmp_path)
    assert preflight(config) == [
        f"streams[0].model: no model package at {wheel / 'mtd-patchcore'} (builtin packages "
        "found: builtin:skab-wstat; builtin:mtd-patchcore is not in the wheel: copy "
        "models/mtd-patchcore from a checkout into a directory DIR and set "
        "EDGE_AGENT_MODELS_DIR=DIR, or give the package directory's path as the stream's model "
        "(docs/install.md))"
    ]
    assert not_found_problem(wheel / "mtd-patchcor") == (
        f"no model package at {wheel / 'mtd-patchcor'} (builtin packages found: "
        "builtin:skab-wstat; builtin:mtd-patchcor is no package this project makes: "
        "`edge-agent models` lists them)")
    assert not_found_problem(wheel / "skab-wstat") is None
    assert not_found_problem(tmp_path / "elsewhere") is None  # a path model: the loader's error
