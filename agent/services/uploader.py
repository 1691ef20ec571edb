"""Store-and-forward upload of alerts and aggregates to the fleet (``[fleet]``).

One thread (``fleet-uploader``) loops: read up to ``batch_records`` un-acknowledged rows from the
store (alerts first, then the aggregate backlog, each oldest first), build a schema-2
:class:`~cloud_sync.protocol.IngestBatch` (:func:`cloud_sync.client.columns_batch_json`: alerts
as record JSON, aggregates as columns, :meth:`agent.store.sqlite.Store.pending_upload_columns`;
the header is validated with pydantic, the records are not re-validated on the device: the fleet
validates each one and rejects bad ones by index), post it with
:class:`~cloud_sync.client.FleetClient`, and apply the fleet's per-record verdict (index ``i``:
the ``i``-th alert, then the aggregates in column order):

* ``accepted`` and ``duplicate`` rows are marked uploaded (never deleted here; the disk budget
  evicts them first when space runs short);
* ``rejected`` rows move to the store's dead-letter table with the fleet's reason, counted in
  ``upload_records_total{status="rejected"}`` and logged once per reason.

Nothing lost, nothing duplicated: a row leaves the queue only when a 200 response names its index.
A crash between the fleet storing a batch and the store marking it just resends the batch; the
fleet's ingest is idempotent on ``(kind, id)`` and answers ``duplicate``, which clears the rows.

Pipelining (``max_in_flight``, draining a backlog): up to that many batches are in flight at
once, each posted from a small thread pool (one HTTP connection each), so the agent's and the
fleet's work overlap (the fleet may run several workers). Batches are disjoint and read in queue
order: each next batch starts after the largest row ids of the batches in flight (row ids are
never reused, see :mod:`agent.store.schema` version 4); while the pipeline is full, the loop
thread also reads and compresses the batch that goes out next, and sends it as soon as an answer
frees a slot (before applying that answer). Answers are applied in sending order, each as
above, so rows are still cleared only by an acknowledgement naming them. A short read (fewer
rows than the batch size: the queue's end) stops reading until every batch in flight is
answered; then the next read starts from the queue's start again, alerts first, so a live alert
waits at most for the batches already in flight plus the one prepared. When the oldest batch
fails, the prepared one is dropped, the others in flight are waited for (those answered 200 are
applied: the fleet has them; each failed one counts in ``upload_failures_total``), and the
failure is handled as below; the next read starts from the queue's start, so the failed rows are
simply sent again. With ``max_in_flight = 1``
this is one request at a time with the next batch read while it is in flight. A prepared
batch's ``sent_at`` is when it was prepared (at most a few requests earlier).

Failures (:mod:`cloud_sync.errors`): :class:`FleetUnavailable` and :class:`FleetProtocolError`
back off exponentially with full jitter (``delay = U(0, min(max, initial * 2**n))``; Marc Brooker,
"Exponential Backoff And Jitter", AWS Architecture Blog, 2015) but wait at least the server's
``Retry-After``. :class:`FleetAuthError` (401/403) is logged once and retried every
``backoff_max_s`` (an operator may re-enroll the device); each 401/403 reads the token file or
variable again, and a new token is used at once (SIGHUP applies one without waiting). A 413, or a
400/422 for a whole batch, halves the batch until the offending record stands alone; a single
record refused that way is dead-lettered. Other 4xx back off like an outage. Outage start and end
are logged once each. A 422 naming ``schema`` for a schema-2 batch is what a fleet that knows only
schema 1 answers: the uploader then sends schema-1 batches (every record as JSON,
:func:`cloud_sync.client.batch_json`) for the rest of its life, logged once, and nothing is
dead-lettered for it.

Bandwidth: with ``max_bytes_per_s`` a token bucket on the compressed body size delays each send
until the budget allows it (bursts up to one second's worth, a single larger body goes into debt).

Wake-up: :meth:`Uploader.notify` (a new alert) ends the idle wait early, never a backoff wait.
:meth:`Uploader.stop` ends the loop; records that arrived during the last idle wait get one
final attempt, bounded by ``stop``'s timeout; then the requests still in flight are cut short
(the ``abort`` callable, :meth:`cloud_sync.client.FleetClient.abort`), so stopping never waits
on a hung fleet (rows not acknowledged stay in the store).

Slow peers: every request has a total deadline in the client
(:class:`~cloud_sync.errors.FleetDeadlineExceeded`). :meth:`Uploader.trouble` names what needs a
look (``/healthz`` shows the uploader yellow with it): a request in flight for longer than
``slow_request_s``, or the last failure being such a deadline, or a failure streak (the fleet
down or refusing: :meth:`~agent.services.upload_failures.UploadFailures.streak`, naming the last
error and the backlog), until an upload succeeds again.
A batch cut off at its deadline is retried in halves (a slow link), doubled back after each
success.

Parts: the ``[fleet]`` config and the device token :mod:`agent.services.fleet_config`; batches,
the client interface and the token bucket :mod:`agent.services.upload_batch`; backoff and the
log-once state of failure episodes :mod:`agent.services.upload_failures`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from agent import __version__
from agent.errors import StoreError
from agent.metrics import Metrics
from agent.services.fleet_config import (
    DEFAULT_MAX_IN_FLIGHT,
    MAX_IN_FLIGHT,
    FleetConfig,
    read_token,
)
from agent.services.upload_batch import Batch, IngestClient, Sent, TokenBucket
from agent.services.upload_failures import UploadFailures, failure_reason
from agent.sources.backoff import Backoff
from agent.store.sqlite import RecordKind, Store
from agent.store.wire import AggregateColumnsText, WireRow, schema1_alert
from cloud_sync.errors import (
    FleetAuthError,
    FleetDeadlineExceeded,
    FleetProtocolError,
    FleetRejected,
    FleetUnavailable,
)
from cloud_sync.protocol import MAX_BATCH_RECORDS, SCHEMA_VERSION, IngestBatch, IngestResult

KIND = "fleet"

#: Names of the uploader's modules kept importable from here (config, token, token bucket).
__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "MAX_IN_FLIGHT",
    "FleetConfig",
    "IngestClient",
    "TokenBucket",
    "Uploader",
    "read_token",
]

log = logging.getLogger("agent.uploader")

#: Least seconds between two refreshes of the backlog gauges (two COUNTs over the store).
BACKLOG_REFRESH_S = 2.0
#: Seconds :meth:`Uploader.stop` waits for the loop after cutting its requests short.
ABORT_JOIN_S = 2.0
_SPLIT_STATUSES = (400, 413, 422)


class Uploader:
    """The upload loop (see the module docstring).

    Args:
        store: The agent's store (the upload queue).
        client: The fleet client (``encode`` + ``send``; one attempt per call).
        device_id: This gateway's id (batch header).
        metrics: Where ``upload_*``, ``sync_lag_seconds`` are counted.
        batch_records: Records per request, 1..``MAX_BATCH_RECORDS``.
        interval_s: Idle wait between polls of the store, seconds.
        backoff_initial_s: First retry delay after a failure, seconds.
        backoff_max_s: Largest retry delay (and the retry period after 401/403), seconds.
        max_bytes_per_s: Cap on compressed bytes sent per second; None = unlimited.
        max_in_flight: Batches in flight at once, 1..``MAX_IN_FLIGHT`` (module docstring).
        agent_version: Sent in every batch.
        clock: Wall clock, epoch seconds UTC (``sent_at``, ``uploaded_at``, sync lag).
        monotonic: Monotonic clock (bandwidth bucket, upload duration).
        stop_event: Set to stop the loop (shared with the agent); a new one when None.
        rng: Random source for the jitter (seeded in tests).
        refresh_token: Called after a 401/403: reads the token again and gives it to the client,
            True when it changed (the retry then comes at once, not after ``backoff_max_s``);
            may raise ConfigError (file gone or empty: the old token stays).
        abort: Cuts the client's requests in progress short (at stop); None = never.
        slow_request_s: A request in flight longer than this is reported by :meth:`trouble`
            (seconds; None = never).

    Raises:
        ValueError: ``batch_records`` outside 1..MAX_BATCH_RECORDS, ``max_in_flight`` outside
            1..MAX_IN_FLIGHT, or a bad backoff range.
    """

    def __init__(
        self,
        store: Store,
        client: IngestClient,
        device_id: str,
        metrics: Metrics,
        *,
        batch_records: int = 500,
        interval_s: float = 5.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 300.0,
        max_bytes_per_s: float | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        agent_version: str = __version__,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        stop_event: threading.Event | None = None,
        rng: random.Random | None = None,
        refresh_token: Callable[[], bool] | None = None,
        abort: Callable[[], object] | None = None,
        slow_request_s: float | None = None,
    ) -> None:
        if not 1 <= batch_records <= MAX_BATCH_RECORDS:
            raise ValueError(f"batch_records must be 1..{MAX_BATCH_RECORDS}, got {batch_records}")
        if not 1 <= max_in_flight <= MAX_IN_FLIGHT:
            raise ValueError(f"max_in_flight must be 1..{MAX_IN_FLIGHT}, got {max_in_flight}")
        self.store = store
        self.client = client
        self.device_id = device_id
        self.metrics = metrics
        self.batch_records = batch_records
        self.max_in_flight = max_in_flight
        self.interval_s = interval_s
        self.agent_version = agent_version
        self.clock = clock
        self.monotonic = monotonic
        self.stop_event = stop_event if stop_event is not None else threading.Event()
        #: Backoff, log-once state and token refresh of a failure episode.
        self.failures = UploadFailures(
            Backoff(backoff_initial_s, backoff_max_s, jitter=1.0, rng=rng), metrics,
            device_id, clock, lambda: self._refresh_gauges(force=True), refresh_token)
        self._bucket = (
            TokenBucket(max_bytes_per_s, monotonic=monotonic) if max_bytes_per_s else None
        )
        self._wake = threading.Event()
        self._limit = batch_records
        self._backlog = (0, 0)
        self._backlog_at = -BACKLOG_REFRESH_S
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight: deque[Sent] = deque()
        self._ready: Batch | None = None
        self._at_end = False  # a short read: read no more until the pipeline is empty
        self._schema = SCHEMA_VERSION  # lower after an older fleet refused it
        self._lifecycle_skip_logged = False
        self._abort = abort
        self._slow_request_s = slow_request_s
        self._started_lock = threading.Lock()
        self._started: dict[int, float] = {}  # request number -> monotonic start
        self._requests = 0

    # -- thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the upload thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="fleet-uploader", daemon=True)
            self._thread.start()

    def notify(self) -> None:
        """A new record was stored: end the idle wait early (not a backoff wait)."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the loop after one final attempt; wait up to ``timeout`` seconds.

        Requests still in flight then are cut short (``abort``) and the loop gets another
        ``ABORT_JOIN_S`` to end.

        Returns:
            True when the thread ended in time (rows not acknowledged stay in the store).
        """
        self.stop_event.set()
        self._wake.set()
        if self._thread is None:
            self.close()
            return True
        self._thread.join(timeout)
        if self._thread.is_alive() and self._abort is not None:
            log.warning("stopping: cutting the fleet request(s) still in flight short after "
                        "%g s", timeout)
            self._abort()
            self._thread.join(ABORT_JOIN_S)
        return not self._thread.is_alive()

    def trouble(self) -> str | None:
        """Why the uploader needs a look, or None (module docstring, "Slow peers")."""
        now = self.monotonic()
        with self._started_lock:
            oldest = min(self._started.values(), default=None)
        if (oldest is not None and self._slow_request_s is not None
                and now - oldest > self._slow_request_s):
            return (f"an upload request has been in flight for {now - oldest:.0f} s (slower "
                    f"than {self._slow_request_s:g} s): the fleet answers slowly or hangs; "
                    "the request is cut off at its total deadline")
        if self.failures.deadline_failure is not None:
            return self.failures.deadline_failure
        return self.failures.streak(self._backlog)

    def close(self) -> None:
        """Forget batches in flight and prepared, end the sender threads (the loop does this on
        exit). Rows not acknowledged stay in the store (resent later; the fleet answers
        ``duplicate`` for those it already stored)."""
        self._ready = None
        for sent in self._in_flight:
            sent.future.cancel()
        self._in_flight.clear()
        self._at_end = False
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                delay = self.run_once()
            except Exception as exc:  # the loop must survive anything: rows stay in the store
                log.exception("upload step failed unexpectedly; records stay in the store")
                self.close()  # a fresh sender pool; batches in flight are sent again
                delay = self.failures.failed("internal", f"{type(exc).__name__}: {exc}", None)
            if delay <= 0:
                continue
            if self.failures.failing:
                self.stop_event.wait(delay)
            else:
                self._wake.wait(delay)
                self._wake.clear()
        if not self.failures.failing:
            self.run_once()  # final attempt: what arrived during the last idle wait
        self._settle()
        self.close()

    # -- one step -------------------------------------------------------------------------------

    def run_once(self) -> float:
        """Send batches until ``max_in_flight`` are in flight, then apply the oldest answer.

        Returns:
            The seconds to wait before the next step: 0 means "more is pending or in flight,
            go on"; ``interval_s`` means "idle"; anything else is a backoff after a failure
            (nothing is in flight then).

        Never raises for fleet or store failures (they are counted and logged).
        """
        try:
            self._fill()
        except StoreError as exc:
            if not self._in_flight:
                return self.failures.failed("store", f"cannot read the upload queue: {exc}", None)
        if not self._in_flight:
            self._at_end = False
            self._refresh_gauges(force=True)
            return self.interval_s
        self._read_ahead()
        head = self._in_flight.popleft()
        try:
            result = head.future.result()
        except (FleetAuthError, FleetRejected, FleetUnavailable, FleetProtocolError) as exc:
            self._settle()
            return self._send_failed(head.batch, exc)
        except BaseException:
            self.close()
            raise
        if self._ready is not None:
            # Its slot is free: keep the fleet busy while this answer is applied (the prepared
            # rows come after the head's, so the order of clearing does not matter).
            self._fill(read=False)
        try:
            self._apply(head.batch, result)
        except StoreError as exc:
            # The fleet has the records; they stay pending here and come back as duplicates.
            self._settle()
            return self.failures.failed("store", f"cannot record the fleet's answer: {exc}", None)
        self.failures.recovered()
        self._limit = min(self.batch_records, self._limit * 2)
        if self._in_flight or self._ready is not None or not head.batch.short:
            return 0.0
        self._at_end = False
        return self.interval_s

    def _fill(self, read: bool = True) -> None:
        """Send the prepared batch, then (``read``) new ones, until the pipeline is full or the
        queue ends.

        Raises StoreError (a read failed; what was sent before stays in flight).
        """
        while len(self._in_flight) < self.max_in_flight:
            batch, self._ready = self._ready, None
            if batch is None:
                if self._at_end or not read:
                    return
                batch = self._prepare(self._limit)
                if batch is None:
                    self._at_end = True
                    return
            self._at_end = batch.short
            if self._bucket is not None:
                wait = self._bucket.reserve(len(batch.body))
                if wait > 0 and self.stop_event.wait(wait):
                    return  # stopping; its rows stay pending
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self.max_in_flight, thread_name_prefix="fleet-send"
                )
            self._in_flight.append(Sent(batch, self._executor.submit(self._send, batch)))

    def _read_ahead(self) -> None:
        """While the pipeline is full, prepare the batch that goes out next (a failed read is
        left for the next :meth:`_fill`, which reports it)."""
        if (self._ready is None and not self._at_end
                and len(self._in_flight) >= self.max_in_flight):
            try:
                self._ready = self._prepare(self._limit)
            except StoreError:
                return
            if self._ready is None:
                self._at_end = True

    def _send(self, batch: Batch) -> IngestResult:
        """One request (a sender thread); its duration goes to ``upload_seconds``."""
        t0 = self.monotonic()
        with self._started_lock:
            self._requests += 1
            number = self._requests
            self._started[number] = t0
        try:
            return self.client.send(batch.body, len(batch))
        finally:
            with self._started_lock:
                del self._started[number]
            self.metrics.upload_seconds.observe(self.monotonic() - t0)

    def _settle(self) -> None:
        """After a failure (or at stop): drop the prepared batch, wait for the batches still in
        flight and apply the answers that came (the fleet stored those rows); the next read
        starts from the queue's start."""
        self._ready = None
        while self._in_flight:
            sent = self._in_flight.popleft()
            try:
                result = sent.future.result()
            except (FleetAuthError, FleetRejected, FleetUnavailable, FleetProtocolError) as exc:
                # counted like any failed request; the backoff is the oldest batch's
                self.metrics.upload_failures_total.labels(reason=failure_reason(exc)).inc()
                log.debug("a batch in flight failed too (%s); its rows are sent again", exc)
                continue
            try:
                self._apply(sent.batch, result)
            except StoreError:
                continue  # pending here, duplicates at the fleet next time
        self._at_end = False

    def _prepare(self, limit: int) -> Batch | None:
        """Read up to ``limit`` rows after those in flight or prepared; build the body.

        The header's ``backlog`` is what the store holds unacknowledged beyond this batch and
        those before it. Raises StoreError; a header pydantic rejects is a bug and raises
        ValidationError.
        """
        backlog = self._refresh_gauges()
        ahead = [s.batch for s in self._in_flight]
        if self._ready is not None:
            ahead.append(self._ready)
        after, n_alerts, n_aggregates = (0, 0), 0, 0
        for b in ahead:  # a batch may hold no row of one kind: the largest id of each kind
            after = (max(after[0], b.after[0]), max(after[1], b.after[1]))
            n_alerts += b.counts[0]
            n_aggregates += b.counts[1]
        schema = self._schema
        records: list[WireRow] = []  # schema 1: alerts, then aggregates, as records
        columns: AggregateColumnsText | None = None  # schema 2/3: the aggregates
        if schema >= 2:
            alerts, columns = self.store.pending_upload_columns(limit, after)
            aggregate_rows = [] if columns is None else columns.row_ids
        else:
            records = self.store.pending_upload_records(limit, after)
            alerts = [r for r in records if r.kind == "alert"]
            aggregate_rows = [r.row_id for r in records[len(alerts):]]
        if schema < 3 and alerts:  # a fleet older than lifecycles
            kept = self._schema1_alerts(alerts)
            if len(kept) < len(alerts) and not kept and not aggregate_rows:
                return self._prepare(limit)  # only events it cannot take: read on
            records = kept + records[len(alerts):]
            alerts = kept
        if not alerts and not aggregate_rows:
            return None
        header = IngestBatch.model_validate({
            "schema": schema,
            "device_id": self.device_id,
            "sent_at": self.clock(),
            "agent_version": self.agent_version[:64],
            "backlog": {
                "alerts": max(0, backlog[0] - n_alerts - len(alerts)),
                "aggregates": max(0, backlog[1] - n_aggregates - len(aggregate_rows)),
            },
            "records": [],
        })
        # cloud_sync.client imports requests: loaded when an uploader runs, not by the config
        from cloud_sync.client import batch_json, columns_batch_json  # noqa: PLC0415

        if schema >= 2:
            document = columns_batch_json(
                header, [r.json for r in alerts], None if columns is None else columns.json
            )
        else:
            document = batch_json(header, [r.json for r in records])
        body = self.client.compress(document)
        return Batch.of([r.row_id for r in alerts], aggregate_rows, body, limit, schema)

    def _schema1_alerts(self, alerts: list[WireRow]) -> list[WireRow]:
        """The alerts a fleet older than schema 3 takes (``raised`` as schema 1); the
        ``updated``/``cleared`` events are marked uploaded without sending (they stay in the
        store, were delivered over MQTT) and counted in
        ``dropped_total{kind="alert_event", reason="fleet_schema"}``."""
        kept: list[WireRow] = []
        skipped: list[int] = []
        for row in alerts:
            old = schema1_alert(row)
            if old is None:
                skipped.append(row.row_id)
            else:
                kept.append(old)
        if skipped:
            self.store.mark_uploaded("alert", skipped, self.clock())
            self.metrics.dropped_total.labels(kind="alert_event", reason="fleet_schema").inc(
                len(skipped))
            if not self._lifecycle_skip_logged:
                self._lifecycle_skip_logged = True
                log.warning("the fleet takes no alert lifecycle events (ingest schema < 3): "
                            "'updated' and 'cleared' events stay on the device; upgrade the fleet")
        return kept

    def _send_failed(self, batch: Batch, exc: Exception) -> float:
        if isinstance(exc, FleetAuthError):
            return self.failures.auth_failed(exc)
        if isinstance(exc, FleetRejected):
            return self._rejected_batch(batch, exc)
        if isinstance(exc, FleetDeadlineExceeded):
            self.failures.deadline_failure = (
                f"the last upload was cut off: {exc}; retrying with backoff")
            self._limit = max(1, len(batch) // 2)  # a slow link: smaller batches (doubled back)
        if isinstance(exc, FleetUnavailable):
            return self.failures.failed("unavailable", str(exc), exc.retry_after_s)
        return self.failures.failed("protocol", str(exc), None)

    def _apply(self, batch: Batch, result: IngestResult) -> None:
        now = self.clock()
        done: dict[RecordKind, list[int]] = {"alert": [], "aggregate": []}
        rejected: dict[tuple[RecordKind, str], list[int]] = {}
        tally: dict[tuple[RecordKind, str], int] = {}
        n_alerts = len(batch.alert_rows)
        alert_rows, aggregate_rows = batch.alert_rows, batch.aggregate_rows
        # One pass over the answer (5,000 items for a full batch): cleared row ids by kind, the
        # rejected ones by reason; the metric tally is counted from the lists afterwards.
        for item in result.results:
            index = item.index
            kind: RecordKind
            if index < n_alerts:
                kind, row_id = "alert", alert_rows[index]
            else:
                kind, row_id = "aggregate", aggregate_rows[index - n_alerts]
            if item.status == "rejected":
                key = (kind, item.reason or "no reason given")
                rejected.setdefault(key, []).append(row_id)
            else:
                done[kind].append(row_id)
                if item.status == "duplicate":
                    tally[(kind, "duplicate")] = tally.get((kind, "duplicate"), 0) + 1
        for kind, ids in done.items():
            accepted = len(ids) - tally.get((kind, "duplicate"), 0)
            if accepted:
                tally[(kind, "accepted")] = accepted
        for (kind, _reason), ids in rejected.items():
            tally[(kind, "rejected")] = tally.get((kind, "rejected"), 0) + len(ids)
        for (kind, status), n in tally.items():
            self.metrics.upload_records_total.labels(kind=kind, status=status).inc(n)
        for kind, ids in done.items():
            self.store.mark_uploaded(kind, ids, now)
        for (kind, reason), ids in rejected.items():
            self._dead_letter(kind, ids, reason)
        self._refresh_gauges(force=False)

    def _dead_letter(self, kind: RecordKind, row_ids: list[int], reason: str) -> None:
        self.store.dead_letter(kind, row_ids, reason)
        self.metrics.dropped_total.labels(kind=kind, reason="rejected").inc(len(row_ids))
        key = f"{kind}:{reason}"
        if self.failures.first_rejection(key):
            log.warning(
                "fleet rejected %d %s record(s): %s (moved to the dead-letter table; this "
                "reason is logged once)", len(row_ids), kind, reason,
            )

    def _rejected_batch(self, batch: Batch, exc: FleetRejected) -> float:
        if exc.status not in _SPLIT_STATUSES:
            return self.failures.failed("rejected", str(exc), None)
        self.metrics.upload_failures_total.labels(reason="rejected").inc()
        if batch.schema >= 2 and exc.status == 422 and "schema" in exc.detail:
            # A fleet that knows only an older schema refuses the whole batch (422 naming the
            # "schema" field): send the previous schema from now on (this uploader's
            # lifetime); the rows are simply read again.
            self._schema = batch.schema - 1
            log.warning(
                "fleet refused a schema-%d batch (HTTP %d: %s); sending schema-%d batches from "
                "now on (upgrade the fleet for %s)", batch.schema, exc.status, exc.detail,
                self._schema, "alert lifecycle events" if batch.schema == 3
                else "the faster columnar form",
            )
            return 0.0
        if len(batch) > 1:
            self._limit = max(1, len(batch) // 2)
            log.debug("HTTP %d for %d records: retrying in halves", exc.status, len(batch))
            return 0.0
        kind, row_id = batch.row(0)
        self._dead_letter(kind, [row_id], f"HTTP {exc.status}: {exc.detail}")
        return 0.0

    # -- gauges ---------------------------------------------------------------------------------

    def _refresh_gauges(self, force: bool = False) -> tuple[int, int]:
        now = self.monotonic()
        if force or now - self._backlog_at >= BACKLOG_REFRESH_S:
            try:
                self._backlog = self.store.upload_backlog()
                oldest = self.store.oldest_pending_upload()
            except StoreError:
                return self._backlog
            self._backlog_at = now
            self.metrics.upload_backlog.labels(kind="alert").set(self._backlog[0])
            self.metrics.upload_backlog.labels(kind="aggregate").set(self._backlog[1])
            lag = 0.0 if oldest is None else max(0.0, self.clock() - oldest)
            self.metrics.sync_lag_seconds.set(lag)
        return self._backlog
