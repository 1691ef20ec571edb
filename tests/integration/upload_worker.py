"""Subprocess for the kill -9 trials: open the agent store, upload until nothing is pending.

Usage: ``python -m tests.integration.upload_worker STORE_DB FLEET_URL TOKEN BATCH``. Prints one
line per upload attempt. Exit 0 when the queue is empty, 3 when the fleet kept failing.
"""

from __future__ import annotations

import sys

from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.services.uploader import Uploader
from agent.store.sqlite import Store
from cloud_sync.client import FleetClient


def main(argv: list[str]) -> int:
    db, url, token, batch = argv[0], argv[1], argv[2], int(argv[3])
    store = Store(db, metrics=None)
    client = FleetClient(url, token, connect_timeout_s=2, read_timeout_s=10)
    up = Uploader(store, client, "gw1", Metrics(CollectorRegistry()), batch_records=batch,
                  interval_s=0.01, backoff_initial_s=0.05, backoff_max_s=0.5)
    failures = 0
    while store.upload_backlog() != (0, 0):
        delay = up.run_once()
        print("batch", flush=True)  # lets the kill -9 test kill mid-upload, not before it
        if delay > 0.02:
            failures += 1
            if failures > 50:
                return 3
            up.stop_event.wait(delay)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
