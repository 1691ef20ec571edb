"""Transport and secrets of the real ``edge-fleet`` process: HTTPS, ``device add --token-file``,
no admin token in worker environments, owner-only files whatever the umask."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleet.db.devices import DeviceRegistry
from fleet.db.engine import make_engine
from fleet.settings import Settings
from tests.integration.fleet_peer import ADMIN_TOKEN, FleetProcess, fleet_command


def self_signed(folder: Path) -> tuple[Path, Path]:
    """``(cert.pem, key.pem)`` for 127.0.0.1, self-signed (the cert is its own CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge-fleet test")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return cert_path, key_path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_serve_https_with_certificate_and_key_files(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path / "tls")
    fleet = FleetProcess(tmp_path / "fleet", scheme="https",
                         extra_args=("--tls-cert", str(cert), "--tls-key", str(key)))
    fleet.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                resp = requests.get(f"{fleet.url}/healthz", verify=str(cert), timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, fleet.log_tail()
                time.sleep(0.2)
        assert resp.status_code == 200
        listed = requests.get(f"{fleet.url}/v1/devices", verify=str(cert), timeout=5,
                              headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert [d["device_id"] for d in listed.json()["devices"]] == ["gw1"]
        try:  # plain HTTP to the TLS port gets no API answer
            plain = requests.get(f"http://127.0.0.1:{fleet.port}/healthz", timeout=5)
            assert plain.status_code != 200
        except requests.RequestException:
            pass
    finally:
        fleet.stop()
    # the database files the fleet wrote (and SQLite's WAL/SHM) are owner-only (umask 077)
    written = [p for p in fleet.workdir.iterdir() if p.name.startswith("fleet.db")]
    assert written
    for path in written:
        assert _mode(path) == 0o600, (path, oct(_mode(path)))


def test_https_connections_that_never_finish_the_handshake_are_closed(tmp_path: Path) -> None:
    """A client that connects to the TLS port and sends nothing (or half a ClientHello) is cut
    off after --request-timeout, like a slow plain-HTTP client: asyncio's default would hold its
    descriptor for 60 s, and 300 of them lock devices out of a fleet with 256 descriptors."""
    cert, key = self_signed(tmp_path / "tls")
    fleet = FleetProcess(tmp_path / "fleet", scheme="https",
                         extra_args=("--tls-cert", str(cert), "--tls-key", str(key),
                                     "--request-timeout", "2"))
    fleet.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(f"{fleet.url}/healthz", verify=str(cert), timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, fleet.log_tail()
                time.sleep(0.2)
        silent = socket.create_connection(("127.0.0.1", fleet.port), timeout=30)
        half = socket.create_connection(("127.0.0.1", fleet.port), timeout=30)
        half.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start
        t0 = time.monotonic()
        for conn in (silent, half):
            with contextlib.suppress(ConnectionResetError):
                assert conn.recv(1024) == b""  # closed by the fleet
        took = time.monotonic() - t0
        assert took < 20.0, f"an unfinished handshake was held {took:.1f} s"
        silent.close()
        half.close()
    finally:
        fleet.stop()


def test_serve_rejects_half_a_tls_configuration(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path / "tls")
    out = subprocess.run(
        [*fleet_command(), "serve", "--state-dir", str(tmp_path / "s"), "--tls-cert", str(cert)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 78, out.stderr
    assert "--tls-cert and --tls-key go together" in out.stderr


def test_device_add_writes_the_token_to_a_new_0600_file(tmp_path: Path) -> None:
    state, token_file = tmp_path / "state", tmp_path / "gw1.token"
    env = {k: v for k, v in os.environ.items() if k != "EDGE_FLEET_ADMIN_TOKEN"}
    cmd = [*fleet_command(), "device", "add", "gw1", "--state-dir", str(state),
           "--token-file", str(token_file), "--create-db"]
    out = subprocess.run(["sh", "-c", 'umask 022; exec "$@"', "sh", *cmd], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    token = token_file.read_text().strip()
    assert token and token not in out.stdout
    assert _mode(token_file) == 0o600
    assert _mode(state) == 0o700  # made by the fleet under umask 022
    assert _mode(state / "fleet.db") == 0o600
    engine = make_engine(Settings(db_url=f"sqlite:///{state / 'fleet.db'}", admin_token="x"))
    try:
        assert DeviceRegistry(engine).authenticate(token) == "gw1"
        # an existing file is never overwritten, and no device is enrolled for nothing
        again = subprocess.run([*cmd[:3], "gw2", *cmd[4:]], env=env, capture_output=True,
                               text=True, timeout=60, check=False)
        assert again.returncode == 78, again.stderr
        assert "exists" in again.stderr
        assert token_file.read_text().strip() == token
        assert DeviceRegistry(engine).get("gw2") is None
    finally:
        engine.dispose()


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


def test_admin_token_is_not_in_worker_environments(tmp_path: Path) -> None:
    fleet = FleetProcess(tmp_path / "fleet", workers=2)  # token given by environment
    fleet.start()
    try:
        assert fleet.pid is not None
        deadline = time.monotonic() + 60
        while len(_children(fleet.pid)) < 2:
            assert time.monotonic() < deadline, fleet.log_tail()
            time.sleep(0.2)
        resp = None
        while resp is None or resp.status_code != 200:  # the workers know the token
            assert time.monotonic() < deadline, fleet.log_tail()
            try:
                resp = requests.get(f"{fleet.url}/v1/devices", timeout=5,
                                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            except requests.ConnectionError:
                time.sleep(0.2)
        children = _children(fleet.pid)
        assert len(children) >= 2
        copies: set[Path] = set()
        for child in children:
            environ = Path(f"/proc/{child}/environ").read_bytes()
            assert ADMIN_TOKEN.encode() not in environ, child
            for entry in environ.split(b"\0"):
                if entry.startswith(b"EDGE_FLEET_ADMIN_TOKEN_FILE="):
                    copies.add(Path(entry.split(b"=", 1)[1].decode()))
        assert len(copies) == 1  # the workers read a private copy: 0600 in a 0700 directory
        copy = copies.pop()
        assert _mode(copy) == 0o600 and _mode(copy.parent) == 0o700
        assert copy.read_text().strip() == ADMIN_TOKEN
    finally:
        fleet.stop()
    assert not copy.exists() and not copy.parent.exists()  # removed at exit
