"""The built wheel is self-contained: the builtin model it ships, the LICENSE, nothing else.

``test_wheel_contents`` and ``test_unpacked_wheel_resolves_builtin`` build the wheel from a copy
of the checkout (tests/packaging/wheel_check.sh --build-only, about 10 s) and read it.
``test_clean_venv_reaches_first_alert`` runs the whole check (a clean virtualenv outside the
checkout, ``edge-agent run`` to its first ALERT; about a minute): only with
``EDGE_AGENT_WHEEL_CHECK=1``, since .ci/run runs that script as a step of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent.config.builtin_models import SHIPPED_IN_WHEEL

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "packaging" / "wheel_check.sh"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run(["bash", str(SCRIPT), "--build-only", str(work)], check=True, timeout=600)
    (built,) = (work / "dist").glob("edge_anomaly_agent-*.whl")
    return built


def test_wheel_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for name in SHIPPED_IN_WHEEL:
            src = REPO / "models" / name
            shipped = {p.name for p in src.iterdir() if p.is_file()}
            assert "manifest.json" in shipped
            for file in shipped:
                assert zf.read(f"agent/builtin_models/{name}/{file}") == (src / file).read_bytes()
        licenses = [n for n in names if n.endswith(".dist-info/LICENSE")
                    or "/licenses/LICENSE" in n]
        assert licenses, "no LICENSE in the wheel's dist-info"
        assert zf.read(licenses[0]) == (REPO / "LICENSE").read_bytes()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {n.split("/", 1)[0] for n in names} == {"agent", "cloud_sync", "fleet", dist_info}
    assert not [n for n in names if "recipes" in n or "benchmarks" in n or "mtd-patchcore" in n]


def test_unpacked_wheel_resolves_builtin(wheel: Path, tmp_path: Path) -> None:
    """The wheel's files alone (no checkout on sys.path) resolve and load builtin:skab-wstat."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    code = (
        "import agent, sys\n"
        "from pathlib import Path\n"
        "from agent.config.schema import resolve_model_path\n"
        "from agent.inference.package import load_package\n"
        "path = resolve_model_path('builtin:skab-wstat', Path.cwd())\n"
        "pkg = load_package(path)\n"
        "print(agent.__file__, path, pkg.manifest.name, pkg.manifest.version, sep='\\n')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "EDGE_AGENT_MODELS_DIR"}
    env["PYTHONPATH"] = str(site)
    out = subprocess.run([sys.executable, "-s", "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == str(site / "agent" / "__init__.py")
    assert lines[1] == str(site / "agent" / "builtin_models" / "skab-wstat")
    assert lines[2] == "skab-wstat"
    shipped = json.loads((REPO / "models" / "skab-wstat" / "manifest.json").read_text())
    assert int(lines[3]) == shipped["version"]  # the wheel carries the checkout's package


@pytest.mark.skipif(os.environ.get("EDGE_AGENT_WHEEL_CHECK") != "1",
                    reason="set EDGE_AGENT_WHEEL_CHECK=1 (.ci/run runs the script itself)")
def test_clean_venv_reaches_first_alert(tmp_path: Path) -> None:
    out = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "check")], capture_output=True,
                         text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "\nALERT " in out.stdout
