"""Memory of a real ``edge-fleet serve`` under large unauthenticated bodies (loopback only).

Starts the fleet (SQLite in the work folder: ``--workdir``, kept, or a temporary folder removed
at the end, also after an error or SIGTERM; on ``--port`` or a free port), then ``--clients``
connections at once each POST a ``--mb`` MB JSON body without a token to each of
``/v1/devices``, ``/v1/rollouts`` and ``/v1/models/status``, and reads the answer. Prints, per
route, the answers' status codes and the server's peak resident memory (``VmHWM`` from
``/proc``) before and after; the first line is ``fleet <url> workdir <folder>``, the last line
``rss_before_mb=<x> rss_peak_mb=<y> statuses=<codes>``. Bounded: ``clients x 3`` requests.

Usage::

    python3 benchmarks/fleet_hostile_bodies.py [--clients 4] [--mb 250] [--port P] [--workdir D]
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workspace import add_arguments, pick_port, workspace

from tests.integration.fleet_peer import FleetProcess

ROUTES = ("/v1/devices", "/v1/rollouts", "/v1/models/status")
_CHUNK = b'{"a": "' + b"x" * ((1 << 20) - 7)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def post(port: int, path: str, mb: int, out: list[str]) -> None:
    size = mb * len(_CHUNK)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: fleet\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {size}\r\n\r\n".encode())
            try:
                for _ in range(mb):
                    s.sendall(_CHUNK)
            except OSError:
                pass  # answered and closed before the whole body was sent
            out.append(s.recv(64).split(b"\r\n", 1)[0].decode(errors="replace"))
    except OSError as exc:
        out.append(type(exc).__name__)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--mb", type=int, default=250)
    add_arguments(ap, port_help="port of the edge-fleet serve peer (default: a free one)")
    args = ap.parse_args()
    with workspace(args.workdir, "fleet-hostile-") as tmp:
        fleet = FleetProcess(tmp / "fleet", port=pick_port(args.port))
        fleet.start()
        print(f"fleet {fleet.url} workdir {tmp}", flush=True)
        try:
            assert fleet.pid is not None
            before = peak_rss_mb(fleet.pid)
            statuses: Counter[str] = Counter()
            for path in ROUTES:
                out: list[str] = []
                threads = [threading.Thread(target=post, args=(fleet.port, path, args.mb, out))
                           for _ in range(args.clients)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                statuses.update(out)
                print(f"{path}: {out}, server peak RSS {peak_rss_mb(fleet.pid):.0f} MB")
            peak = peak_rss_mb(fleet.pid)
        finally:
            fleet.stop()
    print(f"rss_before_mb={before:.0f} rss_peak_mb={peak:.0f} "
          f"statuses={dict(sorted(statuses.items()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
