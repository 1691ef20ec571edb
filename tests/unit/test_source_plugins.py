"""Source kinds are plugins: the edge_agent.sources entry-point group, built-ins included.

The third-party plugin here is a real installed distribution (a ``.dist-info`` with an
``entry_points.txt`` on ``sys.path``, as pip lays it out), found by a fresh ``edge-agent``
process through importlib.metadata.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.sources.registry import BUILTIN, GROUP, PLUGINS, discover

REPO = Path(__file__).resolve().parents[2]

PLUGIN_MODULE = '''
from typing import Literal
import threading
from pydantic import Field
from agent.config.base import StrictModel
from agent.sources.base import SourcePlugin

class LidarConfig(StrictModel):
    """Config of the ``lidar`` test source."""
    kind: Literal["lidar"] = Field("lidar", description="Source kind.")
    channels: list[str] = Field(min_length=1, description="Channel names.")
    calibration: str = Field("cal.json", description="A path relative to the config file.")

class LidarSource:
    def __init__(self, config, stream, **deps):
        self.stream, self.channels = stream, tuple(config.channels)
    def run(self, emit, reject, stop: threading.Event) -> None:
        stop.wait()

PLUGIN = SourcePlugin("lidar", LidarConfig, "lidar_plugin:LidarSource",
                      path_fields=("calibration",))
NOT_A_PLUGIN = 42
'''

CONFIG = """
[[streams]]
name = "l1"
[streams.source]
kind = "lidar"
channels = ["a", "b"]
"""


def _install_plugin(site: Path, entry_points: str) -> None:
    (site / "lidar_plugin.py").write_text(PLUGIN_MODULE)
    dist = site / "lidar_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lidar-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{GROUP}]\n{entry_points}\n")


def _agent(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(site)]))
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def test_setup_cfg_declares_exactly_the_builtin_kinds() -> None:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    declared = [
        line.strip() for line in parser["options.entry_points"][GROUP].splitlines()
        if line.strip()
    ]
    assert sorted(declared) == sorted(BUILTIN)
    assert set(PLUGINS) >= {"camera", "replay", "serial", "simulator"}


def test_an_installed_package_adds_a_kind_known_to_check_config_and_the_default(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_plugin(site, "lidar = lidar_plugin:PLUGIN")
    config = tmp_path / "agent.toml"
    config.write_text(CONFIG)
    checked = _agent(site, "check-config", str(config))
    assert checked.returncode == 0, checked.stderr
    assert "l1: lidar, 2 channels" in checked.stdout

    config.write_text(CONFIG + "chanels = []\n")
    bad = _agent(site, "check-config", str(config))
    assert bad.returncode == 78
    assert "streams[0].source.chanels: unknown key (did you mean 'channels'?)" in bad.stderr

    dumped = _agent(site, "print-default-config")
    assert dumped.returncode == 0
    assert "#   lidar: Config of the ``lidar`` test source." in dumped.stdout


def test_without_the_package_the_kind_is_unknown(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(CONFIG)
    result = _agent(tmp_path, "check-config", str(config))
    assert result.returncode == 78
    assert "streams[0].source: Input tag 'lidar' found using 'kind' does not match" in (
        result.stderr)


def test_plugin_paths_are_resolved_against_the_config_dir(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_plugin(site, "lidar = lidar_plugin:PLUGIN")
    script = textwrap.dedent(f"""
        from pathlib import Path
        from agent.config.loader import parse_config
        cfg = parse_config({CONFIG!r}, env={{}}).resolved(Path("/etc/edge"))
        print(cfg.streams[0].source.calibration)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(site)]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "/etc/edge/cal.json"


def _ep(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=GROUP)


def test_broken_plugins_are_skipped_and_named(tmp_path: Path, monkeypatch: object) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_plugin(site, "")
    sys.path.insert(0, str(site))
    try:
        plugins, broken = discover([
            _ep("nosuch", "no_such_module:PLUGIN"),
            _ep("wrongtype", "lidar_plugin:NOT_A_PLUGIN"),
            _ep("misnamed", "lidar_plugin:PLUGIN"),
            _ep("serial", "lidar_plugin:PLUGIN"),  # may not replace a built-in kind
        ])
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("lidar_plugin", None)
    assert set(broken) == {"nosuch", "wrongtype", "misnamed"}
    assert "ModuleNotFoundError" in broken["nosuch"]
    assert "not an agent.sources.base.SourcePlugin" in broken["wrongtype"]
    assert "its plugin's kind is 'lidar'" in broken["misnamed"]
    assert plugins["serial"] is PLUGINS["serial"]


def test_a_plugin_config_without_a_docstring_is_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    # the config class of docs/sources.md's example has no docstring: print-default-config
    # used to die with IndexError listing the installed kinds
    from typing import Literal  # noqa: PLC0415

    from pydantic import Field  # noqa: PLC0415

    from agent.config.base import StrictModel  # noqa: PLC0415
    from agent.sources.base import SourcePlugin  # noqa: PLC0415
    from agent.sources.registry import describe_kinds  # noqa: PLC0415

    class Bare(StrictModel):
        kind: Literal["bare"] = Field("bare", description="Source kind.")

    monkeypatch.setitem(PLUGINS, "bare", SourcePlugin("bare", Bare, "nowhere:Bare"))
    assert "bare: (no description)" in describe_kinds()
