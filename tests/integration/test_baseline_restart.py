"""A univariate stream's adapted baseline across restarts: ``edge-agent run`` as a subprocess on
replayed CSV files, a real mosquitto, the real SQLite store in the state directory.

Run 1 calibrates on a channel at 20, alerts when it shifts to 23 and follows the new level
within its drift bound. Run 2 (a restart, as systemd would do it) replays more readings at 23:
the baseline comes back from the store and the old shift raises no alert again (before, every
restart started from the calibration's baseline and alerted on it anew). Run 3 names a new
version of the package: the stored baseline is discarded with one INFO line.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import MosquittoBroker
from tests.integration.test_agent_e2e import (
    AgentProcess,
    db_rows,
    parse_iso,
    run_agent,  # noqa: F401 - fixture
    stored_alerts,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "models" / "univariate-wstat"
VERSION: int = json.loads((PACKAGE / "manifest.json").read_text())["version"]
T0 = 1_700_000_000.0
LEVEL, SHIFT, NOISE = 20.0, 3.0, 0.5  # the shift: 6 calibration sigmas, inside the bound (24)


def write_csv(path: Path, start: int, values: np.ndarray) -> Path:
    rows = ["timestamp,value"] + [f"{T0 + start + i:.0f},{v:.6f}" for i, v in enumerate(values)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def write_config(path: Path, csv: Path, port: int, model: str = "builtin:univariate-wstat"
                 ) -> Path:
    path.write_text(
        '[agent]\ndevice_id = "gw-test"\nstate_dir = "state"\nconsole_alerts = true\n\n'
        f'[[streams]]\nname = "temp"\nmodel = {json.dumps(model)}\n'
        f'[streams.source]\nkind = "replay"\npath = {json.dumps(str(csv))}\n'
        'time_column = "timestamp"\nspeed = 0\n\n'
        f'[mqtt]\nenabled = true\nhost = "127.0.0.1"\nport = {port}\nkeepalive_s = 5\n'
        "reconnect_min_s = 1\nreconnect_max_s = 1\n")
    return path


def stored_baseline(db: Path) -> tuple[Any, ...]:
    """(model_version, level centre, saved_at) of stream temp's stored baseline."""
    rows = db_rows(db, "SELECT model_version, baseline, saved_at FROM baselines "
                       "WHERE stream = 'temp'")
    assert len(rows) == 1, rows
    version, text, saved_at = rows[0]
    return version, json.loads(text)["centre"][0], saved_at


def test_a_followed_level_shift_does_not_alert_again_after_a_restart(
    tmp_path: Path, mosquitto: MosquittoBroker, run_agent: Callable[..., AgentProcess]  # noqa: F811
) -> None:
    rng = np.random.default_rng(3)
    db = tmp_path / "state" / "agent.db"
    config = tmp_path / "agent.toml"

    def run(csv: Path, model: str = "builtin:univariate-wstat") -> tuple[str, list[Any]]:
        before = len(stored_alerts(db))
        write_config(config, csv, mosquitto.port, model)
        agent = run_agent(["run", "--config", str(config)], tmp_path)
        assert agent.wait(120) == 0, agent.stderr()
        err = agent.stderr()
        assert "Traceback" not in err and "stored baseline refused" not in err, err[-3000:]
        return err, stored_alerts(db)[before:]

    # run 1: 400 calibration readings and 200 more at 20, then 2,400 at 23
    first = np.concatenate([LEVEL + NOISE * rng.normal(size=600),
                            LEVEL + SHIFT + NOISE * rng.normal(size=2400)])
    err, alerts = run(write_csv(tmp_path / "run1.csv", 0, first))
    assert alerts, f"the level shift raised no alert; stderr:\n{err[-3000:]}"
    assert T0 + 600 <= parse_iso(alerts[0]["payload"]["window_end"]) < T0 + 700
    assert all(a["published_at"] is not None for a in alerts)  # delivered over MQTT
    saved = db_rows(db, "SELECT model_version, baseline FROM baselines WHERE stream = 'temp'")

    # run 2, a restart: the same level; the baseline is resumed and the old shift stays quiet
    second = LEVEL + SHIFT + NOISE * rng.normal(size=600)
    err, alerts = run(write_csv(tmp_path / "run2.csv", 3000, second))
    assert alerts == [], f"the followed shift alerted again after the restart: {alerts}"
    assert "calibration restored" in err
    assert "adapted baseline restored" in err, err[-3000:]
    assert len(saved) == 1 and saved[0][0] == VERSION
    assert json.loads(saved[0][1])["centre"][0] > 4.0  # calibration sigmas: the shift followed
    assert stored_baseline(db)[1] > 4.0

    # run 3: a new version of the package; its calibration and the baseline are discarded
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE, pkg)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["version"] = VERSION + 1
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    err, _ = run(write_csv(tmp_path / "run3.csv", 3600, second), str(pkg))
    label = f"univariate-wstat@{VERSION} → univariate-wstat@{VERSION + 1}"
    assert (f"stream temp: stored baseline discarded (model changed ({label})); starting from "
            "the calibration's baseline") in err
    assert err.count("stored baseline discarded") == 1
    assert "adapted baseline restored" not in err
    assert stored_baseline(db)[0] == VERSION + 1  # the new package's own baseline, saved
