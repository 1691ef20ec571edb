"""Test helpers for model updates: signed test packages and a small fake fleet over HTTP.

:func:`make_package` copies ``models/skab-wstat``, sets the version (and optionally tampers with
golden outputs or the latency budget) and signs ``manifest.json`` with a key from
:func:`cloud_sync.package.generate_keypair`; :func:`pack` gives the archive.

:class:`FakeFleet` is a ``http.server`` implementation of the device side of the model-loop
contract (:mod:`cloud_sync.protocol`): ``GET /v1/models/assignment?stream=`` (200 or 204),
``GET /v1/models/<name>/<version>/package`` with ``Range: bytes=<start>-`` (206 with
Content-Range, or 416), ``POST /v1/models/status`` (204, recorded). Faults: ``drop_after`` cuts the
connection after N bytes of the next package response; ``ignore_range`` answers 200 to a Range.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import tarfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from cloud_sync.package import pack, sign_package_dir

MODELS = Path(__file__).resolve().parents[2] / "models"
SOURCE_PACKAGE = MODELS / "skab-wstat"
#: The version of ``builtin:skab-wstat`` (the shipped package): updates are numbered above it.
BUILTIN_VERSION: int = json.loads((SOURCE_PACKAGE / "manifest.json").read_text())["version"]


def make_package(
    out_dir: Path,
    version: int,
    key: Path,
    *,
    golden_delta: float = 0.0,
    latency_budget_ms: float | None = None,
    source: Path = SOURCE_PACKAGE,
    name: str | None = None,
) -> Path:
    """A signed copy of ``source`` with ``version`` (and ``name``, tampered as asked); returns
    its directory."""
    d = out_dir / f"pkg-{name or ''}v{version}-{golden_delta}-{latency_budget_ms}"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(source, d)
    raw: dict[str, Any] = json.loads((d / "manifest.json").read_text())
    raw["version"] = version
    if name is not None:
        raw["name"] = name
    raw.pop("signature", None)
    if golden_delta:
        outputs = raw["golden"]["outputs"]
        raw["golden"]["outputs"] = [[v + golden_delta for v in row] for row in outputs]
    if latency_budget_ms is not None:
        raw["latency_budget_ms_p99"] = latency_budget_ms
    (d / "manifest.json").write_text(json.dumps(raw))
    sign_package_dir(d, key)
    return d


def flip_byte(package_dir: Path, artefact: str = "model.int8.onnx", offset: int = 100) -> None:
    """Flip one byte of an artefact in place (after signing: the manifest no longer matches)."""
    path = package_dir / artefact
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def tar_gz(package_dir: Path) -> bytes:
    """A tar.gz of every file of ``package_dir`` without any check (for tampered packages)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted(package_dir.iterdir()):
            tar.add(f, arcname=f.name)
    return buf.getvalue()


def tar_gz_with(package_dir: Path, extra: dict[str, bytes]) -> bytes:
    """:func:`tar_gz` of a (valid, signed) package plus ``extra`` members the manifest does not
    name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted(package_dir.iterdir()):
            tar.add(f, arcname=f.name)
        for name, data in extra.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pax_bomb(header_bytes: int) -> bytes:
    """A tar.gz whose first entry is a PAX extended header announcing ``header_bytes`` (a
    multiple of 1 MiB) of zeros, then a small file: about 1 kB per MiB announced.

    Built from concatenated gzip members (RFC 1952 section 2.2; readers see one stream), so a
    1 GiB header costs one compressed MiB of zeros repeated, not a GiB of compression.
    """
    assert header_bytes % (1 << 20) == 0
    head = tarfile.TarInfo("././@PaxHeader")
    head.type = tarfile.XHDTYPE
    head.size = header_bytes
    parts = [gzip.compress(head.tobuf(format=tarfile.USTAR_FORMAT), mtime=0)]
    parts += [gzip.compress(b"\0" * (1 << 20), mtime=0)] * (header_bytes >> 20)
    tail = io.BytesIO()
    with tarfile.open(fileobj=tail, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    parts.append(gzip.compress(tail.getvalue(), mtime=0))
    return b"".join(parts)


@dataclass
class Served:
    """One archive the fake fleet serves."""

    name: str
    version: int
    data: bytes

    @property
    def url(self) -> str:
        return f"/v1/models/{self.name}/{self.version}/package"


@dataclass
class FleetState:
    token: str
    assignment: dict[str, Any] | None = None
    archives: dict[str, Served] = field(default_factory=dict)
    reports: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    drop_after: int | None = None
    ignore_range: bool = False
    #: Answer every poll with the assignment, whatever stream it names (a hostile fleet).
    unfiltered: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _auth(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {self.server.state.token}":
            self._send(401, b'{"detail": "unknown token"}')
            return False
        return True

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        st = self.server.state
        with st.lock:
            st.requests.append(("GET", self.path, dict(self.headers)))
        if not self._auth():
            return
        url = urlparse(self.path)
        if url.path == "/v1/models/assignment":
            stream = parse_qs(url.query).get("stream", [""])[0]
            a = st.assignment
            if a is None or (not st.unfiltered and a.get("stream") not in (None, stream)):
                self._send(204)
            else:
                self._send(200, json.dumps(a).encode(), {"Content-Type": "application/json"})
            return
        served = st.archives.get(url.path)
        if served is None:
            self._send(404, b'{"detail": "no such package"}')
            return
        self._package(served)

    def _package(self, served: Served) -> None:
        st = self.server.state
        data = served.data
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(m.group(1)) if m and not st.ignore_range else 0
        if start >= len(data) and m:
            self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            return
        body = data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with st.lock:
            drop, st.drop_after = st.drop_after, None
        if drop is not None:
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def do_POST(self) -> None:
        st = self.server.state
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if not self._auth():
            return
        if urlparse(self.path).path == "/v1/ingest":  # the agent's uploader: accept everything
            n = len(json.loads(gzip.decompress(body))["records"])
            results = [{"index": i, "status": "accepted"} for i in range(n)]
            self._send(200, json.dumps({"results": results}).encode())
            return
        if urlparse(self.path).path != "/v1/models/status":
            self._send(404)
            return
        with st.lock:
            st.reports.append(json.loads(body))
        self._send(204)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: FleetState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state


class FakeFleet:
    """The fake fleet in a background thread (``url``; ``state`` to steer and inspect it)."""

    def __init__(self, token: str = "device-token") -> None:
        self.state = FleetState(token)
        self._server = _Server(self.state)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeFleet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def publish(self, package_dir: Path, workdir: Path, stream: str | None = None,
                rollback: dict[str, Any] | None = None, rollout_id: int | None = 1,
                checked: bool = True) -> Served:
        """Pack ``package_dir`` and assign it (to ``stream`` or every stream).

        ``checked=False`` archives the directory as it is (tampered packages).
        """
        raw = json.loads((package_dir / "manifest.json").read_text())
        if checked:
            archive = workdir / f"{raw['name']}-{raw['version']}-{package_dir.name}.tar.gz"
            pack(package_dir, archive)
            data = archive.read_bytes()
        else:
            data = tar_gz(package_dir)
        sha = hashlib.sha256(data).hexdigest()
        served = Served(raw["name"], raw["version"], data)
        with self.state.lock:
            self.state.archives[served.url] = served
            self.state.assignment = {
                "rollout_id": rollout_id, "stream": stream, "name": served.name,
                "version": served.version, "archive_sha256": sha,
                "archive_size": len(served.data), "url": served.url, "rollback": rollback,
            }
        return served

    def serve(self, assignment: dict[str, Any], data: bytes | None = None) -> None:
        """Answer every assignment poll with ``assignment`` as given (any JSON, hostile
        included) and serve ``data`` at its ``url`` when given (sha256 and size filled in
        unless the assignment sets them)."""
        with self.state.lock:
            a = dict(assignment)
            if data is not None:
                a.setdefault("archive_sha256", hashlib.sha256(data).hexdigest())
                a.setdefault("archive_size", len(data))
                self.state.archives[str(a["url"])] = Served(
                    str(a["name"]), int(a["version"]), data)
            self.state.assignment = a
            self.state.unfiltered = True

    def states(
        self, stream: str | None = None, *, running: bool = False
    ) -> list[tuple[int, str]]:
        """(version, state) of every update report so far, in order; with ``running``, also the
        agent's start-up reports of what each stream runs (``details.origin``)."""
        with self.state.lock:
            return [(r["version"], r["state"]) for r in self.state.reports
                    if (stream is None or r["stream"] == stream)
                    and (running or "origin" not in r.get("details", {}))]
