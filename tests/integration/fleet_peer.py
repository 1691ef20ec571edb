"""A real ``edge-fleet serve`` process, for sync tests and the benchmarks.

``FleetProcess`` enrolls a device (``edge-fleet device add``), starts the server on a fixed free
port, and can stop/kill/restart it on the same port; ``counts`` reads the fleet's database
directly (``COUNT(*)`` and ``COUNT(DISTINCT id)`` per record table). The database is a SQLite
file in ``workdir`` unless ``db_url`` names another (``postgresql+psycopg://...``). ``serve_args``
are added to ``edge-fleet serve`` (e.g. ``--trusted-keys DIR --rollback-key FILE``); ``cli`` runs
an operator command (``model push``, ``rollout create``...) against the server.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ADMIN_TOKEN = "admin-token-for-tests-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fleet_command() -> list[str]:
    exe = shutil.which("edge-fleet")
    return [exe] if exe else [sys.executable, "-m", "fleet.cli"]


class FleetProcess:
    """One fleet server process with its SQLite database in ``workdir``."""

    def __init__(
        self, workdir: Path, device_id: str = "gw1", db_url: str | None = None, workers: int = 1,
        serve_args: Sequence[str] = (),
        *, extra_args: tuple[str, ...] = (), nofile: int | None = None, scheme: str = "http",
        port: int | None = None,
    ) -> None:
        """``extra_args`` go to ``serve``; ``nofile`` caps its descriptors (``LimitNOFILE``)."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.workers = workers
        self.serve_args = list(serve_args)
        self.extra_args = extra_args
        self.nofile = nofile
        self.workdir = workdir
        self.db_path = workdir / "fleet.db"
        self.db_url = db_url or f"sqlite:///{self.db_path}"
        self.port = free_port() if port is None else port
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.env = {**os.environ, "EDGE_FLEET_ADMIN_TOKEN": ADMIN_TOKEN}
        self.log_path = workdir / "fleet.log"
        out = subprocess.run(
            [*fleet_command(), "device", "add", device_id, "--db", self.db_url,
             "--state-dir", str(workdir), "--create-db"],
            env=self.env, capture_output=True, text=True, check=True, timeout=60,
        )
        self.token = out.stdout.strip().splitlines()[-1].strip()
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [*fleet_command(), "serve", "--db", self.db_url, "--port", str(self.port),
                 "--state-dir", str(self.workdir), "--log-level", "warning",
                 "--workers", str(self.workers), *self.serve_args, *self.extra_args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )
        if self.nofile is not None:  # before it imports anything: it listens seconds later
            resource.prlimit(self._proc.pid, resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"edge-fleet serve exited:\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"edge-fleet serve did not listen in {timeout_s} s")

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def cli(self, *args: str) -> str:
        """Run ``edge-fleet <args>`` against this server (admin token); its stdout.

        Raises:
            AssertionError: the command failed (with its stderr).
        """
        out = subprocess.run(
            [*fleet_command(), *args], env={**self.env, "EDGE_FLEET_URL": self.url},
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert out.returncode == 0, f"edge-fleet {' '.join(args)}: {out.stderr}"
        return out.stdout

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def counts(self, table: str) -> tuple[int, int]:
        """``(COUNT(*), COUNT(DISTINCT id))`` of ``alerts`` or ``aggregates`` in the fleet DB."""
        assert table in ("alerts", "aggregates")
        sql = f"SELECT COUNT(*), COUNT(DISTINCT id) FROM {table}"
        if self.db_url.startswith("postgresql"):
            import psycopg  # noqa: PLC0415

            with psycopg.connect(self.db_url.replace("+psycopg", "")) as pg:
                row = pg.execute(sql).fetchone()
                assert row is not None
                return int(row[0]), int(row[1])
        conn = sqlite3.connect(self.db_path, timeout=30)
        try:
            row = conn.execute(sql).fetchone()
        finally:
            conn.close()
        return int(row[0]), int(row[1])

    def ids(self, table: str) -> list[str]:
        assert table in ("alerts", "aggregates")
        conn = sqlite3.connect(self.db_path, timeout=30)
        try:
            return [r[0] for r in conn.execute(f"SELECT id FROM {table}")]
        finally:
            conn.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
