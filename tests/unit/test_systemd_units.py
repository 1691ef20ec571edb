"""The systemd units (systemd-analyze verify and security) and systemd/install.sh."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.services.uploader import FleetConfig

REPO = Path(__file__).resolve().parents[2]
UNITS = ["edge-agent.service", "edge-fleet.service"]
INSTALL = REPO / "systemd" / "install.sh"
MAX_EXPOSURE = 2.0


def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze missing in CI (.ci/run installs the systemd package)")
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    return tool


@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies(unit: str, tmp_path: Path) -> None:
    tool = _analyze()
    # verify checks that ExecStart exists: point the venv at stubs, change nothing else.
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    for name in ("edge-agent", "edge-fleet"):
        stub = venv_bin / name
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    text = (REPO / "systemd" / unit).read_text()
    assert "/opt/edge-agent/venv/bin/" in text
    copy = tmp_path / unit
    copy.write_text(text.replace("/opt/edge-agent/venv/bin/", f"{venv_bin}/"))
    out = subprocess.run([tool, "verify", str(copy)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.strip() == "", out.stderr


@pytest.mark.parametrize("unit", UNITS)
def test_unit_exposure_at_most_2(unit: str) -> None:
    tool = _analyze()
    out = subprocess.run(
        [tool, "security", "--offline=yes", str(REPO / "systemd" / unit)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", out.stdout)
    assert match, out.stdout + out.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, match.group(0)


def test_agent_unit_contract() -> None:
    text = (REPO / "systemd" / "edge-agent.service").read_text()
    for line in (
        "Type=notify", "NotifyAccess=main", "WatchdogSec=", "RestartPreventExitStatus=78",
        "StateDirectory=edge-agent", "User=edge-agent", "ExecReload=/bin/kill -HUP $MAINPID",
        "LoadCredential=mqtt-password:", "Environment=EDGE_AGENT_MODELS_DIR=/opt/edge-agent/models",
        "DeviceAllow=char-ttyUSB rw", "DeviceAllow=char-ttyACM rw", "DeviceAllow=char-ttyS rw",
        "DeviceAllow=char-video4linux rw",
    ):
        assert line in text, line
    # the drain (8 s) and flush (10 s) on SIGTERM, and an upload in flight until the default
    # fleet read timeout (a tester's hung fleet held the exit that long), fit in TimeoutStopSec
    stop = int(re.search(r"^TimeoutStopSec=(\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert stop >= FleetConfig().read_timeout_s + 20


def _install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_install_dry_run_changes_nothing_and_lists_every_step(tmp_path: Path) -> None:
    prefix = tmp_path / "root"
    out = _install("--dry-run", "--prefix", str(prefix))
    assert out.returncode == 0, out.stderr
    assert not prefix.exists()
    text = out.stdout
    for expected in (
        f"python3 -m venv {prefix}/opt/edge-agent/venv",
        "-m pip install --disable-pip-version-check --upgrade " + str(REPO),
        f"cp -r {REPO}/models {prefix}/opt/edge-agent/models.new",
        f"{REPO}/systemd/agent.example.toml {prefix}/etc/edge-agent/agent.toml",
        f"{prefix}/etc/edge-agent/credentials/mqtt-password",
        f"{prefix}/etc/systemd/system/edge-agent.service",
        "+ systemctl daemon-reload",
        "+ systemctl enable edge-agent.service",
    ):
        assert expected in text, expected


def test_install_dry_run_without_prefix_creates_the_user() -> None:
    out = _install("--dry-run", "--fleet", "--wheel", "/tmp/x.whl")
    assert out.returncode == 0, out.stderr
    assert "/tmp/x.whl[fleet]" in out.stdout
    if "keep user edge-agent" not in out.stdout:
        assert "useradd --system" in out.stdout and "edge-agent" in out.stdout
    assert "edge-fleet.service" in out.stdout


def test_install_into_a_prefix_is_idempotent(tmp_path: Path) -> None:
    prefix = tmp_path / "root"
    args = ("--prefix", str(prefix), "--no-systemctl", "--skip-venv")
    first = _install(*args)
    assert first.returncode == 0, first.stdout + first.stderr
    config = prefix / "etc/edge-agent/agent.toml"
    assert config.read_text() == (REPO / "systemd/agent.example.toml").read_text()
    assert (prefix / "opt/edge-agent/models/skab-wstat/manifest.json").is_file()
    assert (prefix / "etc/systemd/system/edge-agent.service").is_file()
    secret = prefix / "etc/edge-agent/credentials/mqtt-password"
    assert secret.stat().st_mode & 0o777 == 0o600
    config.write_text(config.read_text() + "# edited\n")
    secret.write_text("s3cret\n")
    second = _install(*args)
    assert second.returncode == 0, second.stderr
    assert config.read_text().endswith("# edited\n")
    assert secret.read_text() == "s3cret\n"
    assert f"keep {config}" in second.stdout
    assert "+ systemctl" not in second.stdout


def test_install_rejects_unknown_options() -> None:
    assert _install("--frobnicate").returncode == 2
