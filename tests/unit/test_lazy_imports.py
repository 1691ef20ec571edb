"""The agent imports the fleet transport's libraries (requests, urllib3, cryptography) only
when a feature that needs them is used: an agent without ``[fleet]`` or signed model updates
never loads them (about 15 MB resident)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("requests", "urllib3", "cryptography")


def _loaded_after(code: str) -> list[str]:
    roots = "{m.split('.')[0] for m in sys.modules}"
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({roots} & {set(HEAVY)!r})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_the_agent_and_its_config_do_not_load_the_fleet_libraries() -> None:
    assert _loaded_after(
        "import agent.cli, agent.app, agent.compose\n"
        "from agent.config.loader import parse_config\n"
        "parse_config('[agent]\\ndevice_id = \"gw1\"\\n[[streams]]\\nname = \"s\"\\n"
        "[streams.source]\\nkind = \"simulator\"\\n', env={})") == []


def test_they_load_when_used() -> None:
    assert _loaded_after(
        "from agent.services.fleet_transport import warn_plaintext\n"
        "warn_plaintext('https://fleet.example')\n"
        "from cloud_sync.package import fingerprint, generate_keypair, load_public_key\n"
        "import tempfile, pathlib\n"
        "d = pathlib.Path(tempfile.mkdtemp())\n"
        "fingerprint(load_public_key(generate_keypair(d, 'k')[1]))") == ["cryptography",
                                                                          "urllib3"]
