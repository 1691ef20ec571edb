"""The bounded queue between the sources and the pipeline.

Sources put readings on it from their threads; the pipeline (:mod:`agent.run_loop`) takes them
in batches. Two ways in:

* :meth:`ReadingQueue.put_until_stopped`, the ``emit`` of most sources: waits for room as long
  as the agent runs (backpressure: a serial port or a Modbus poll simply reads later);
* :meth:`ReadingQueue.offer`, for sources that must not block (the MQTT input runs paho's
  keepalive in its thread, :class:`agent.sources.base.TakesOffer`): waits at most ``wait_s`` and
  says whether the reading was taken; the source keeps what was not.
"""

from __future__ import annotations

import queue
import threading

from agent.records import Reading

#: Longest single wait of :meth:`ReadingQueue.put_until_stopped` before it checks ``stop``, s.
STOP_CHECK_S = 0.5


class ReadingQueue(queue.Queue[Reading]):
    """A :class:`queue.Queue` of readings with a stop-aware put and a bounded offer.

    Args:
        maxsize: Most readings queued.
        stop: Set when the agent stops; a waiting put gives up then.
    """

    def __init__(self, maxsize: int, stop: threading.Event) -> None:
        super().__init__(maxsize=maxsize)
        self._stop = stop

    def put_until_stopped(self, reading: Reading) -> None:
        """Queue ``reading``, waiting for room until it is there or ``stop`` is set (then the
        reading is not queued)."""
        while not self._stop.is_set():
            try:
                self.put(reading, timeout=STOP_CHECK_S)
                return
            except queue.Full:
                continue

    def offer(self, reading: Reading, wait_s: float) -> bool:
        """Queue ``reading`` if there is room within ``wait_s`` seconds (0 = now); True when
        it was queued."""
        try:
            if wait_s > 0:
                self.put(reading, timeout=wait_s)
            else:
                self.put_nowait(reading)
        except queue.Full:
            return False
        return True
