"""The store writer: commits alerts that were published already, in groups, on its own thread.

Publish while committing (:mod:`agent.publish.keeper`): the pipeline thread numbers an alert from
the id ledger's reserved block (:meth:`agent.store.ids.IdLedger.take`, durable before the number
is used), hands it to the MQTT publisher's in-memory queue and to this writer, and goes on. The
writer's thread (``store-writer``) takes every alert queued while its last commit ran and stores
them in ONE durable transaction (:meth:`agent.store.sqlite.Store.add_numbered_alerts`: one fsync
per group, the episode marks with their alerts), then reports each alert's outbox row (or that the
store refused the group) through ``on_commit``, so the publisher marks the row published once both
the commit and the broker's PUBACK are in.

Queue bound: at most :data:`QUEUE_LIMIT` alerts wait; :meth:`AlertWriter.put` blocks beyond that
(the pipeline slows down instead of holding unbounded memory).

Test hook: ``EDGE_AGENT_TEST_COMMIT_DELAY_S`` (seconds, read by :func:`commit_delay_from_env`)
delays every commit, so an integration test can kill the agent between publish and commit. Never
set in production.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from agent.errors import StoreError
from agent.records import Alert
from agent.store.episodes import EpisodeMark
from agent.store.sqlite import Store

log = logging.getLogger("agent.store")

#: Most alerts waiting for their commit; :meth:`AlertWriter.put` blocks beyond it.
QUEUE_LIMIT = 10_000
#: Most alerts in one transaction.
GROUP_LIMIT = 512
#: The test hook's environment variable (see the module docstring).
COMMIT_DELAY_ENV = "EDGE_AGENT_TEST_COMMIT_DELAY_S"

#: ``on_commit`` argument: ``(alert_id, outbox row id)`` per alert; row id 0 = not stored
#: (already stored under that id), -1 = the store refused the group.
Committed = Sequence[tuple[str, int]]


def commit_delay_from_env() -> float:
    """Seconds every commit is delayed by (the test hook; 0 when unset or not a number)."""
    try:
        return max(0.0, float(os.environ.get(COMMIT_DELAY_ENV, "0")))
    except ValueError:
        return 0.0


class AlertWriter:
    """Group-commits numbered alerts on its own thread (see the module docstring).

    Args:
        store: The store the alerts go into.
        on_commit: Called on the writer's thread after each group with its :data:`Committed`
            results; must not block.
        commit_delay_s: Extra seconds before each commit (the test hook only).
        group_limit: Most alerts per transaction.
        queue_limit: Most alerts waiting.
    """

    def __init__(self, store: Store, on_commit: Callable[[Committed], None], *,
                 commit_delay_s: float = 0.0, group_limit: int = GROUP_LIMIT,
                 queue_limit: int = QUEUE_LIMIT) -> None:
        self._store = store
        self._on_commit = on_commit
        self._delay = commit_delay_s
        self._group_limit = group_limit
        self._queue_limit = queue_limit
        self._queue: collections.deque[tuple[Alert, str, EpisodeMark | None]] = (
            collections.deque())
        self._cond = threading.Condition()
        self._busy = 0  # alerts taken by the thread and not yet reported
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._failing = False
        #: Alerts stored so far / refused by the store so far / transactions so far.
        self.stored = 0
        self.refused = 0
        self.commits = 0

    def start(self) -> None:
        """Start the writer's thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        """True from :meth:`start` until :meth:`stop`."""
        with self._cond:
            return self._thread is not None and not self._stopping

    def put(self, alert: Alert, payload: str, episode: EpisodeMark | None) -> None:
        """Queue one alert for the next group commit (blocks while :data:`QUEUE_LIMIT` wait).

        Raises:
            StoreError: The writer is stopped (the alert was not queued).
        """
        with self._cond:
            while len(self._queue) >= self._queue_limit and not self._stopping:
                self._cond.wait(0.1)
            if self._stopping or self._thread is None:
                raise StoreError("the store writer is not running", op="add_alert",
                                 path=self._store.path)
            self._queue.append((alert, payload, episode))
            self._cond.notify_all()

    def pending(self) -> int:
        """Alerts queued or being committed."""
        with self._cond:
            return len(self._queue) + self._busy

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued alert was committed (or refused); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def stop(self, timeout_s: float = 5.0) -> int:
        """Commit what is queued (up to ``timeout_s``), then end the thread.

        Returns:
            Alerts left uncommitted (0 normally).
        """
        self.flush(timeout_s)
        with self._cond:
            self._stopping = True
            left = len(self._queue)
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        return left

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                n = min(len(self._queue), self._group_limit)
                group = [self._queue.popleft() for _ in range(n)]
                self._busy = n
                self._cond.notify_all()
            try:
                self._commit(group)
            except Exception:  # the thread must survive anything; the alerts stay volatile
                log.exception("store writer failed on a group of %d alert(s)", len(group))
                self._report([(a.alert_id, -1) for a, _, _ in group])
            with self._cond:
                self._busy = 0
                self._cond.notify_all()

    def _commit(self, group: list[tuple[Alert, str, EpisodeMark | None]]) -> None:
        if self._delay:
            time.sleep(self._delay)
        try:
            rows = self._store.add_numbered_alerts(group)
        except StoreError as exc:
            self.refused += len(group)
            if not self._failing:
                self._failing = True
                log.error("store refused %d alert(s) (%s); they are delivered over MQTT from "
                          "memory (lost if the agent stops before the broker has them)",
                          len(group), exc)
            self._report([(a.alert_id, -1) for a, _, _ in group])
            return
        if self._failing:
            self._failing = False
            log.warning("the store takes alerts again")
        self.commits += 1
        self.stored += sum(1 for r in rows if r > 0)
        for stream in {a.stream for a, _, _ in group}:
            self._store.ids.top_up(stream)
        self._report([(a.alert_id, r) for (a, _, _), r in zip(group, rows, strict=True)])

    def _report(self, results: Committed) -> None:
        try:
            self._on_commit(results)
        except Exception:
            log.exception("store writer: on_commit failed")
