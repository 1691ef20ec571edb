"""``edge-fleet`` without the fleet extra: one line and exit 69, not a traceback (fleet/entry.py).

Each case runs the entry point in a fresh interpreter whose import system refuses some modules
(a ``sys.meta_path`` blocker installed before anything of fleet is imported), as a gateway venv
without ``pip install 'edge-anomaly-agent[fleet]'`` would.
"""

from __future__ import annotations

import configparser
import doctest
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import entry

REPO = Path(__file__).resolve().parents[2]

#: These need the fleet extra installed (the suite on Python 3.10 runs in a venv with the wheel's
#: test extra only; CI's main run has the fleet extra).
needs_fleet = pytest.mark.skipif(
    importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("sqlalchemy") is None,
    reason="needs the fleet extra: pip install '.[fleet]'",
)

_RUN_BLOCKED = """
import sys
BLOCKED = set(sys.argv[1].split(","))

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED or name.split(".", 1)[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
from fleet.entry import main
sys.exit(main(sys.argv[2:]))
"""


def _run_blocked(blocked: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", _RUN_BLOCKED, blocked, *argv],
        capture_output=True, text=True, timeout=120, env=env, cwd=cwd, check=False,
    )


@pytest.mark.parametrize("argv", [
    ["serve", "--port", "0"],
    ["device", "list"],
    ["keys", "generate", "--key-id", "k1", "--out", "keys"],
])
def test_without_sqlalchemy_one_line_and_exit_69(argv: list[str], tmp_path: Path) -> None:
    out = _run_blocked("sqlalchemy", *argv, cwd=tmp_path)
    assert out.returncode == entry.EX_UNAVAILABLE == 69, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(
        "edge-fleet needs the fleet extra: pip install 'edge-anomaly-agent[fleet]'")
    assert "sqlalchemy" in lines[0]
    assert "Traceback" not in out.stderr
    assert out.stdout == ""


@needs_fleet
def test_without_fastapi_too(tmp_path: Path) -> None:
    """A module the CLI imports lazily (FastAPI, when serve builds the app) is covered as well."""
    out = _run_blocked("fastapi,starlette", "serve", "--port", "0", cwd=tmp_path)
    assert out.returncode == 69, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"{entry.MISSING_EXTRA} (no module named 'fastapi')"]


@needs_fleet
def test_own_missing_module_keeps_its_traceback(tmp_path: Path) -> None:
    """A module the extra does not install is a bug: the traceback stays, the exit is not 69."""
    out = _run_blocked("fleet.db.devices", "device", "list", cwd=tmp_path)
    assert out.returncode == 1
    assert "Traceback" in out.stderr
    assert "fleet.db.devices" in out.stderr
    assert entry.MISSING_EXTRA not in out.stderr


def test_console_script_is_the_thin_entry() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    scripts = cfg["options.entry_points"]["console_scripts"]
    assert "edge-fleet = fleet.entry:main" in scripts.splitlines()


@needs_fleet
def test_extra_modules_cover_the_fleet_extra() -> None:
    """Every requirement of the fleet extra in setup.cfg has its import name in the list."""
    import importlib.metadata as md  # noqa: PLC0415

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    reqs = [line.strip() for line in cfg["options.extras_require"]["fleet"].splitlines()
            if line.strip() and not line.strip().startswith("#")]
    dists: dict[str, set[str]] = {}
    for module, names in md.packages_distributions().items():
        for name in names:
            dists.setdefault(name.lower().replace("_", "-"), set()).add(module)
    for req in reqs:
        dist = req.split("[", 1)[0].split(">", 1)[0].split("=", 1)[0].strip().lower()
        modules = dists.get(dist.replace("_", "-"), set())
        assert modules & entry.FLEET_EXTRA_MODULES, (req, modules)


def test_doctests() -> None:
    result = doctest.testmod(entry)
    assert result.attempted >= 2
    assert result.failed == 0
