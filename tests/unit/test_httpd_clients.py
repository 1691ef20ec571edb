"""The operations endpoint with clients that hang up, stall, or break a request
(agent.httpd): no traceback on stderr, no thread kept by an idle connection, one WARNING for a
real failure."""

from __future__ import annotations

import logging
import socket
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from agent.health import Component, Report
from agent.httpd import OpsServer


def _server(**kw: float) -> OpsServer:
    return OpsServer(CollectorRegistry(), lambda: Report((Component("pipeline", "green"),), 1.0),
                     **kw).start()


def test_a_client_that_sends_nothing_is_closed_after_the_timeout() -> None:
    server = _server(client_timeout_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET /metr")  # a byte-a-second client that stopped
            t0 = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server, no answer
            assert time.monotonic() - t0 < 4.5
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as r:
            assert r.status == 200  # still serving
    finally:
        server.stop()


def test_a_client_that_trickles_its_request_is_closed_after_the_timeout() -> None:
    # the socket timeout bounds each read: a byte every 0.1 s never tripped it, and the
    # connection kept its thread as long as the client kept trickling
    server = _server(client_timeout_s=0.5)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    closed = False
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.settimeout(0.1)
            for byte in request:  # 20 s of trickling, 40 x the timeout
                try:
                    sock.sendall(bytes([byte]))
                    closed = sock.recv(1024) == b""
                except TimeoutError:
                    continue  # nothing from the server yet: still open
                except OSError:
                    closed = True
                if closed:
                    break
        assert closed, "the server kept a trickling connection open"
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as r:
            assert r.status == 200  # still serving
    finally:
        server.stop()


def test_a_client_that_hangs_up_is_not_an_error(capsys: pytest.CaptureFixture[str],
                                                caplog: pytest.LogCaptureFixture) -> None:
    server = _server()
    try:
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            server._server.handle_error(None, ("127.0.0.1", 1))
        # socketserver's own handle_error prints this and a traceback
        assert "Exception occurred during processing" not in capsys.readouterr().err
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        server.stop()


def test_another_failure_is_one_warning_not_a_traceback_flood(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    server = _server()
    try:
        with caplog.at_level(logging.WARNING, logger="agent.httpd"):
            for _ in range(5):
                try:
                    raise ValueError("bad")
                except ValueError:
                    server._server.handle_error(None, ("127.0.0.1", 1))
        assert "Exception occurred during processing" not in capsys.readouterr().err
        assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1
    finally:
        server.stop()
