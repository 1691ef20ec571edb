"""A source under the real SourceSupervisor, collecting what it emits (for the protocol tests)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.records import Reading
from agent.services.supervisor import SourceSupervisor
from tests.integration.test_serial_pty import sample


class Supervised:
    """Runs ``source`` (stream ``stream``) under a SourceSupervisor with its own metrics.

    Attributes:
        source, metrics, stop, readings, sup: The parts, for the test to look at.
    """

    def __init__(self, source: Any, stream: str, join_s: float = 10.0) -> None:
        self.source = source
        self.stream = stream
        self.join_s = join_s
        self.metrics = Metrics(CollectorRegistry())
        self.stop = threading.Event()
        self.readings: list[Reading] = []
        self.sup = SourceSupervisor(source, self.readings.append, self.metrics, self.stop,
                                    logging.getLogger(f"test.{stream}"), backoff_initial_s=0.05,
                                    backoff_max_s=0.2)
        self.sup.start()

    def rejected(self, reason: str) -> float:
        """``edge_agent_records_rejected_total`` of this stream for ``reason``."""
        return sample(self.metrics, "edge_agent_records_rejected_total", stream=self.stream,
                      reason=reason)

    def metric(self, name: str, **labels: str) -> float:
        """A sample of this stream's metric ``name``."""
        return sample(self.metrics, name, stream=self.stream, **labels)

    def values(self) -> list[list[float]]:
        """Every reading's values, in order."""
        return [r.values.tolist() for r in list(self.readings)]

    def close(self) -> None:
        """Stop the source and wait for its thread."""
        self.stop.set()
        self.sup.join(self.join_s)
        assert not self.sup.is_alive()
