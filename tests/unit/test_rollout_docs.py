"""docs/rollouts.md's walk-through pushes the version the gateways run and one above it.

The builtin skab-wstat went from version 1 to 2 while the walk-through still copied it as "v1"
and set "version": 2 on the copy: two packages of the same version, the second push refused. The
walk-through now raises the copy's version by one; its command is run here as written.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "rollouts.md"
BUILTIN = REPO / "models" / "skab-wstat"


def test_next_version_is_one_above_the_builtin(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("NEXT=$(python3 -c ")]
    target = tmp_path / "build" / "skab-wstat-next"
    shutil.copytree(BUILTIN, target)
    out = subprocess.run(["bash", "-c", f"{line}\necho \"$NEXT\""], cwd=tmp_path, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    builtin = json.loads((BUILTIN / "manifest.json").read_text(encoding="utf-8"))["version"]
    assert out == [str(builtin + 1)]
    assert json.loads((target / "manifest.json").read_text(encoding="utf-8"))["version"] == (
        builtin + 1)
    assert 'edge-fleet rollout create skab-wstat "$NEXT"' in text
    assert not re.search(r"rollout create skab-wstat \d", text)
