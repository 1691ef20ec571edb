"""Secrets at rest: token and password files with loose modes, and the modes of what the agent
writes (a real ``edge-agent run`` under the usual umask 022)."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from agent.cli import main
from agent.errors import ConfigError
from agent.exitcodes import EX_CONFIG
from agent.publish.mqtt import read_password
from agent.secret_files import check_secret_file, secure_state
from agent.services.uploader import FleetConfig, read_token
from agent.sources.mqtt_in import MqttInSource
from agent.sources.mqtt_in_config import MqttInConfig
from agent.sources.opcua import OpcuaSource
from agent.sources.opcua_config import OpcuaConfig
from agent.store.sqlite import Store
from tests.integration.test_agent_e2e import edge_agent
from tests.tls_certs import TestCA

SENSOR = """
[agent]
device_id = "gw1"
state_dir = "state"
[[streams]]
name = "pump"
[streams.source]
kind = "simulator"
"""


def secret(tmp_path: Path, mode: int, name: str = "fleet.token") -> Path:
    path = tmp_path / name
    path.write_text("s3cret-token\n")
    path.chmod(mode)
    return path


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_token_file_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = secret(tmp_path, mode)
    config = FleetConfig(enabled=True, url="https://f", token_file=str(path))
    with pytest.raises(ConfigError, match=r"fleet\.token_file.*writable") as info:
        read_token(config)
    assert "s3cret" not in str(info.value)


def test_a_password_file_others_can_write_fails_check_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret(tmp_path, 0o646, "pw")
    config = tmp_path / "agent.toml"
    config.write_text(SENSOR + '[mqtt]\nenabled = true\nusername = "u"\npassword_file = "pw"\n')
    assert main(["check-config", str(config)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert "mqtt.password_file" in err and "writable by others" in err and "chmod 600" in err


def test_a_readable_token_file_is_warned_about_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = secret(tmp_path, 0o644)
    config = FleetConfig(enabled=True, url="https://f", token_file=str(path))
    with caplog.at_level(logging.WARNING, logger="agent.secrets"):
        for _ in range(3):  # read again at every 401 and SIGHUP
            assert read_token(config) == "s3cret-token"
    texts = [r.getMessage() for r in caplog.records if "readable by" in r.getMessage()]
    assert len(texts) == 1 and "its group and others" in texts[0] and str(path) in texts[0]


def test_a_private_password_file_and_a_systemd_credential_are_not_warned_about(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    private = secret(tmp_path, 0o600, "pw")
    creds = tmp_path / "credentials"
    creds.mkdir()
    # systemd's ACL for the service user shows as group bits: not a finding.
    credential = secret(creds, 0o440, "mqtt-password")
    with caplog.at_level(logging.WARNING, logger="agent.secrets"):
        assert read_password(str(private)) == "s3cret-token"
        check_secret_file(str(credential), "mqtt.password_file",
                          environ={"CREDENTIALS_DIRECTORY": str(creds)})
    assert not [r for r in caplog.records if r.name == "agent.secrets"]


def test_secure_state_narrows_what_an_older_version_left(tmp_path: Path) -> None:
    state = tmp_path / "state"
    pkg = state / "models" / "skab-wstat-3"
    pkg.mkdir(parents=True)
    for d in (state, state / "models", pkg):
        d.chmod(0o755)
    (pkg / "model.onnx").write_bytes(b"x")
    (pkg / "model.onnx").chmod(0o644)
    db = state / "agent.db"
    Store(db).close()
    db.chmod(0o644)
    secure_state(state, db)
    assert [mode_of(p) for p in (state, state / "models", pkg)] == [0o700] * 3
    assert mode_of(pkg / "model.onnx") == 0o600
    assert mode_of(db) == 0o600


def test_the_agent_writes_its_data_owner_only_under_umask_022(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    old = state / "agent.db"
    Store(old).close()  # a store an older version made
    old.chmod(0o644)
    config = tmp_path / "agent.toml"
    config.write_text(SENSOR)
    umask = os.umask(0o022)  # the usual login umask, inherited by the agent
    try:
        proc = subprocess.Popen([*edge_agent(), "run", "--config", str(config)], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finally:
        os.umask(umask)
    try:
        deadline = time.monotonic() + 60
        while not (state / "agent.db-wal").exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the agent did not write its store in 60 s"
            time.sleep(0.1)
        modes = {p.name: mode_of(p) for p in state.iterdir() if p.is_file()}
        dir_mode = mode_of(state)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert dir_mode == 0o700
    assert modes["agent.db"] == 0o600 and modes["agent.db-wal"] == 0o600, modes
    assert all(m & 0o077 == 0 for m in modes.values()), modes  # lock, shm: owner only too


def test_ca_files_others_can_write_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = TestCA(tmp_path / "pki")
    ca.cert_file.chmod(0o664)  # anyone in the group could add their own CA
    secret(tmp_path, 0o600, "gw1.token")
    config = tmp_path / "agent.toml"
    config.write_text(SENSOR + f"""
[mqtt]
enabled = true
tls = true
ca_file = "{ca.cert_file}"
[fleet]
enabled = true
url = "https://127.0.0.1:9"
token_file = "gw1.token"
ca_file = "{ca.cert_file}"
""")
    assert main(["check-config", str(config)]) == EX_CONFIG
    err = capsys.readouterr().err
    for key in ("mqtt.ca_file", "fleet.ca_file"):
        assert f"{key}: {str(ca.cert_file)!r} is writable by its group" in err, err
    ca.cert_file.chmod(0o644)  # readable by all is right for a CA
    assert main(["check-config", str(config)]) == 0, capsys.readouterr().err


# --- the mqtt and opcua sources' password files (a retest of issue 15 found them unchecked) ---


def _mqtt_in(password: Path, host: str = "127.0.0.1", **extra: object) -> MqttInConfig:
    return MqttInConfig.model_validate({
        "format": "json", "topics": ["t"], "fields": {"p": "p"}, "host": host,
        "username": "in", "password_file": str(password), **extra})


def _opcua(password: Path, endpoint: str, **extra: object) -> OpcuaConfig:
    return OpcuaConfig.model_validate({
        "endpoint": endpoint, "nodes": [{"channel": "a", "node_id": "ns=2;s=A"}],
        "username": "edge", "password_file": str(password), **extra}, strict=False)


@pytest.mark.parametrize("mode", [0o666, 0o620])
def test_source_password_files_others_can_write_are_refused(tmp_path: Path, mode: int) -> None:

    path = secret(tmp_path, mode, "pw")
    with pytest.raises(ConfigError, match=r"source\.password_file.*writable") as info:
        MqttInSource(_mqtt_in(path), "in-w")
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigError, match=r"source\.password_file.*writable"):
        OpcuaSource(_opcua(path, "opc.tcp://127.0.0.1:4840"), "opc-w")


def test_source_password_files_readable_by_others_are_warned_about_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:

    mqtt_pw, opc_pw = secret(tmp_path, 0o644, "mqtt-pw"), secret(tmp_path, 0o604, "opc-pw")
    with caplog.at_level(logging.WARNING, logger="agent.secrets"):
        for _ in range(2):
            MqttInSource(_mqtt_in(mqtt_pw), "in-r")
            OpcuaSource(_opcua(opc_pw, "opc.tcp://127.0.0.1:4840"), "opc-r")
    texts = [r.getMessage() for r in caplog.records if "readable by" in r.getMessage()]
    assert len(texts) == 2, texts
    assert any(str(mqtt_pw) in t for t in texts) and any(str(opc_pw) in t for t in texts)


def test_a_source_password_in_clear_to_a_remote_peer_is_warned_about_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:

    pw = secret(tmp_path, 0o600, "pw")
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with caplog.at_level(logging.WARNING, logger="agent.secrets"):
        for _ in range(3):
            MqttInSource(_mqtt_in(pw, host="0.0.0.0", port=18884), "in-c")
            OpcuaSource(_opcua(pw, "opc.tcp://10.0.0.7:4840", security_policy="None"), "opc-c")
        # TLS, or a loopback peer, or a security policy: no warning
        MqttInSource(_mqtt_in(pw, host="broker.lan", ca_file=str(ca)), "in-t")
        MqttInSource(_mqtt_in(pw, host="127.0.0.1"), "in-l")
        OpcuaSource(_opcua(pw, "opc.tcp://localhost:4840", security_policy="None"), "opc-l")
    texts = [r.getMessage() for r in caplog.records if "plain TCP" in r.getMessage()]
    assert len(texts) == 2, texts
    assert "0.0.0.0:18884" in texts[0] and "'in'" in texts[0] and "ca_file" in texts[0]
    assert "10.0.0.7:4840" in texts[1] and "security_policy" in texts[1]
    assert "s3cret" not in " ".join(texts)


def test_a_source_password_file_others_can_write_fails_check_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret(tmp_path, 0o666, "pw")
    config = tmp_path / "agent.toml"
    config.write_text(SENSOR + '[[streams]]\nname = "in"\n[streams.source]\nkind = "mqtt"\n'
                      'format = "json"\ntopics = ["t"]\nfields = {p = "p"}\nhost = "0.0.0.0"\n'
                      'username = "in"\npassword_file = "pw"\n')
    assert main(["check-config", str(config)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert "streams[1].source.password_file" in err and "writable by its group and others" in err
