"""The composition root builds a univariate stream from the shipped one-channel package: the
stream's ``channel`` key maps a source channel onto it, alerts name that channel and explain
themselves, and a mapping that cannot hold is a config problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from agent.app import Agent
from agent.config.loader import parse_config
from agent.errors import ConfigError, ModelError
from agent.inference.package import load_package, open_backend
from agent.inference.registry import installed
from agent.metrics import Metrics
from agent.pipeline.univariate import UnivariatePipeline
from agent.systemd import Notifier

PACKAGE = Path(__file__).resolve().parents[2] / "models" / "univariate-wstat"


def _agent(tmp_path: Path, channel: str | None, columns: tuple[str, ...],
           rules: tuple[str, ...] = (), model: str = "builtin:univariate-wstat") -> Agent:
    csv = tmp_path / "plant.csv"
    rows = [",".join(("timestamp", *columns))]
    rows += [",".join((str(1_700_000_000 + i), *("1.0" for _ in columns))) for i in range(5)]
    csv.write_text("\n".join(rows) + "\n", encoding="utf-8")
    text = "\n".join([
        "[agent]", 'device_id = "gw1"', f'state_dir = "{tmp_path / "state"}"',
        "console_alerts = false",
        "[[streams]]", 'name = "temp"', f'model = "{model}"',
        'backend = "onnxruntime"', *([f'channel = "{channel}"'] if channel else []),
        "[streams.source]", 'kind = "replay"', f'path = "{csv}"', 'time_column = "timestamp"',
        *(("[streams.rules]", *rules) if rules else ()),
    ]) + "\n"
    return Agent(parse_config(text, env={}), Metrics(), console=None, notifier=Notifier(""))


def test_a_mapped_channel_is_scored_named_and_explained(tmp_path: Path) -> None:
    agent = _agent(tmp_path, "bearing_temp", ("motor_current", "bearing_temp"))
    try:
        s = agent.streams["temp"]
        pipe = s.pipeline
        assert isinstance(pipe, UnivariatePipeline)
        assert pipe.channel_label == "bearing_temp"
        rng = np.random.default_rng(0)
        x = 40.0 + 0.2 * rng.normal(size=(1500, 1))
        x[1000:] += 3.0
        alerts = pipe.process_block(x, 1_700_000_000.0 + np.arange(1500.0)).alerts
        assert alerts and alerts[0].explanation is not None
        assert [t.channel for t in alerts[0].top_channels] == ["bearing_temp"]
        assert alerts[0].explanation.expected == pytest.approx(40.0, abs=0.1)
    finally:
        agent.shutdown()


def test_a_single_channel_source_needs_no_mapping(tmp_path: Path) -> None:
    agent = _agent(tmp_path, None, ("current",))
    try:
        pipe = agent.streams["temp"].pipeline
        assert isinstance(pipe, UnivariatePipeline) and pipe.channel_label == "current"
    finally:
        agent.shutdown()


def test_a_stream_without_rule_keys_uses_the_package_rule(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"  # the shipped package with a rule unlike the agent's 7 of 10
    shutil.copytree(PACKAGE, pkg)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["univariate"].update(rule_k=4, rule_n=6, rule_spike=2.5)
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    cases = {(): (4, 6), ("top_channels = 1",): (4, 6), ("k = 7", "n = 10"): (7, 10),
             ("cooldown_s = 5.0",): (7, 10)}
    for i, (rules, want) in enumerate(cases.items()):
        (tmp_path / str(i)).mkdir()
        agent = _agent(tmp_path / str(i), None, ("current",), rules, str(pkg))
        try:
            p = agent.streams["temp"].pipeline.rules.params
            assert (p.k, p.n) == want, rules
            assert p.spike_factor == 2.5, rules  # its own key: kept whatever the table sets
            assert (p.clear_ratio, p.clear_windows) == (0.9, 5)
            assert p.cooldown_s == (5.0 if "cooldown_s = 5.0" in rules else 60.0)
        finally:
            agent.shutdown()


def test_an_ambiguous_or_wrong_mapping_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="name the one to score with 'channel'"):
        _agent(tmp_path, None, ("a", "b"))
    with pytest.raises(ConfigError, match="not a channel of the source"):
        _agent(tmp_path, "c", ("a", "b"))


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino", "litert"])
def test_every_artefact_of_the_package_passes_its_golden_vectors(runtime: str) -> None:
    if not installed(runtime):
        pytest.skip(f"{runtime} is not installed")
    package = load_package(PACKAGE)
    assert package.univariate_params() is not None
    assert package.manifest.input.channels == ["value"]
    backend = open_backend(package, "int8", runtime=runtime)  # raises on a golden mismatch
    assert backend.precision == "int8"


def test_a_univariate_section_on_a_multichannel_package_is_refused(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    shutil.copytree(Path(__file__).resolve().parents[2] / "models" / "skab-wstat", pkg)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["univariate"] = json.loads((PACKAGE / "manifest.json").read_text())["univariate"]
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="needs exactly one channel"):
        load_package(pkg)


def test_a_package_with_threshold_sigma_runs_the_robust_score(tmp_path: Path) -> None:
    """The manifest's ``univariate.threshold_sigma`` and its adaptation keys reach the stream:
    after calibration the threshold is that many robust sigmas and the baseline adapts."""
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE, pkg)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["univariate"].update(threshold_sigma=6.0, scale_rate=0.02, clip=2.5, scale_bound=3.0)
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    params = load_package(pkg).univariate_params()
    assert params is not None and params.robust is not None
    assert (params.threshold_sigma, params.robust.scale_rate, params.robust.clip,
            params.robust.scale_bound) == (6.0, 0.02, 2.5, 3.0)
    shipped = load_package(PACKAGE).univariate_params()
    assert shipped is not None and shipped.threshold_sigma is not None  # @3: the robust score
    manifest["univariate"].pop("threshold_sigma")  # a package before @3
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    assert load_package(pkg).univariate_params().robust is None  # type: ignore[union-attr]
    manifest["univariate"]["threshold_sigma"] = 6.0
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    agent = _agent(tmp_path, None, ("current",), (), str(pkg))
    try:
        pipe = agent.streams["temp"].pipeline
        assert isinstance(pipe, UnivariatePipeline)
        x = np.random.default_rng(0).normal(20.0, 0.5, size=(600, 1))
        pipe.process_block(x, 1_600_000_000 + np.arange(600.0))
        assert pipe.threshold == 6.0 and pipe.robust_state is not None
    finally:
        agent.shutdown()
