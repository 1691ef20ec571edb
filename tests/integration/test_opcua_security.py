"""OpcuaSource against a real asyncua server that demands security: Basic256Sha256 Sign (the
SignAndEncrypt case is in test_opcua.py), and a user name with its password read from a file
(the server's user manager accepts one user).

Certificates are self-signed RSA-2048, made per test (tests.integration.opcua_peer).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import _free_port
from tests.integration.opcua_peer import OpcuaPeer, make_certificate
from tests.integration.test_opcua import Running
from tests.integration.test_serial_pty import wait_for

pytest.importorskip("asyncua")
pytestmark = pytest.mark.integration

CLIENT_URI = "urn:example.org:FreeOpcUa:opcua-asyncio"


def test_basic256sha256_sign(tmp_path: Path) -> None:
    server_cert = make_certificate(tmp_path, "server", "urn:freeopcua:python:server")
    client_cert, client_key = make_certificate(tmp_path, "client", CLIENT_URI)
    peer = OpcuaPeer(_free_port(), secure=True, certificate=server_cert, mode="Sign").start()
    keys = {"security_policy": "Basic256Sha256", "certificate_file": str(client_cert),
            "private_key_file": str(client_key), "server_certificate_file": str(server_cert[0])}
    try:
        signed = Running(peer.endpoint, security_mode="Sign", **keys)
        # the server offers Sign only: SignAndEncrypt finds no endpoint, None is not offered
        encrypted = Running(peer.endpoint, security_mode="SignAndEncrypt", **keys)
        plain = Running(peer.endpoint)
        try:
            assert wait_for(lambda: len(signed.readings) >= 1, timeout=30)
            peer.write("Flow", 8.25)
            assert wait_for(lambda: any(v[1] == 8.25 for v in signed.values()), timeout=10)
            assert signed.sup.outage is None
            for refused in (encrypted, plain):
                assert wait_for(lambda r=refused: r.sup.outage is not None, timeout=20)
                assert refused.readings == []
        finally:
            for run in (signed, encrypted, plain):
                run.close()
    finally:
        peer.stop()


def test_username_and_password_from_a_file(tmp_path: Path) -> None:
    password = tmp_path / "opcua-password"
    password.write_text("pump room 7\n", encoding="utf-8")  # a trailing newline, as editors save
    wrong = tmp_path / "wrong-password"
    wrong.write_text("pump room 8\n", encoding="utf-8")
    peer = OpcuaPeer(_free_port(), users={"edge": "pump room 7"}).start()
    try:
        user = Running(peer.endpoint, username="edge", password_file=str(password))
        bad = Running(peer.endpoint, username="edge", password_file=str(wrong))
        anonymous = Running(peer.endpoint)
        try:
            assert wait_for(lambda: len(user.readings) >= 1, timeout=30)
            peer.write("Pressure", 2.75)
            assert wait_for(lambda: any(v[0] == 2.75 for v in user.values()), timeout=10)
            assert user.sup.outage is None
            for refused in (bad, anonymous):
                assert wait_for(lambda r=refused: r.sup.outage is not None, timeout=20)
                assert refused.readings == []
            assert bad.sup.outage is not None and "BadUserAccessDenied" in bad.sup.outage[0]
            assert ("edge", True) in peer.logins and ("edge", False) in peer.logins
        finally:
            for run in (user, bad, anonymous):
                run.close()
    finally:
        peer.stop()
