"""Webhook delivery: HMAC-signed HTTP POSTs from the durable queue, with retries and a cap.

Each delivery is ``POST <url>`` with the body queued for it (:mod:`fleet.db.webhooks`, JSON
``{"event", "created_at", "data"}``) and the headers

* ``Content-Type: application/json``;
* ``X-Edge-Event``: the event (``alert``, ``device_offline``, ``rollout_halted``);
* ``X-Edge-Delivery``: the delivery id (the same on every retry: dedupe on it);
* ``X-Edge-Signature-256: sha256=<hex>``: HMAC-SHA256 of the raw body bytes with the webhook's
  secret (RFC 2104), the scheme of GitHub's ``X-Hub-Signature-256``. A receiver recomputes it
  over the bytes it received and compares in constant time (``hmac.compare_digest``).

A 2xx answer is delivered. Anything else (another status, a refused connection, a timeout, a
receiver past the total deadline) is retried after ``min(backoff_max_s, backoff_base_s x
2^(attempt-1))`` seconds times a random factor in [0.5, 1) ("equal jitter": AWS Architecture Blog,
"Exponential Backoff And Jitter", 2015), until ``max_attempts`` attempts: then the delivery is
``dead`` (the dead-letter list). Redirects are not followed (a 3xx is a failure).

Bounds: every attempt runs under a total deadline (``timeout_s``, :mod:`cloud_sync.deadline`:
the sockets are shut down when it passes, so a receiver that trickles its answer one byte at a
time cannot hold a sender), reads at most 4 KiB of the answer, and runs in a small thread pool
apart from the API's threads: a hanging receiver delays only its own deliveries.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests

from cloud_sync.deadline import Deadlines, install
from fleet.db.webhooks import Delivery, WebhookStore

SIGNATURE_HEADER = "X-Edge-Signature-256"
_ANSWER_BYTES = 4096

_log = logging.getLogger(__name__)


def sign(secret: str, body: bytes) -> str:
    """The ``X-Edge-Signature-256`` value of ``body``: ``sha256=`` + HMAC-SHA256 hex.

    >>> sign("It's a Secret to Everybody", b"Hello, World!")
    'sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17'
    """
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str) -> bool:
    """True when ``header`` is the signature of ``body`` (constant-time comparison)."""
    return hmac.compare_digest(sign(secret, body), header)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a delivery is tried.

    Attributes:
        max_attempts: Attempts before the delivery is dead (>= 1).
        backoff_base_s: Delay after the first failure (before jitter), seconds.
        backoff_max_s: Largest delay, seconds.
        timeout_s: Total deadline of one attempt (connect, send, answer), seconds.
    """

    max_attempts: int = 10
    backoff_base_s: float = 10.0
    backoff_max_s: float = 3600.0
    timeout_s: float = 10.0

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Seconds before attempt ``attempt + 1`` after ``attempt`` failed (1-based)."""
        raw = min(self.backoff_max_s, self.backoff_base_s * 2.0 ** (attempt - 1))
        return raw * rng.uniform(0.5, 1.0)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Dispatcher:
    """Sends due deliveries from one polling thread through a small sender pool.

    Args:
        store: The queue.
        policy: Retries and bounds.
        poll_s: Seconds between two looks at the queue when idle (:meth:`wake` ends a wait).
        senders: Deliveries in flight at once.
        clock: Aware UTC now.
        rng: Jitter source.
        on_result: Called with ``(event, outcome)`` per attempt (metrics): outcome
            ``delivered``, ``retry`` or ``dead``.
    """

    def __init__(
        self, store: WebhookStore, policy: RetryPolicy, *, poll_s: float = 2.0,
        senders: int = 4, clock: Callable[[], dt.datetime] = _now,
        rng: random.Random | None = None,
        on_result: Callable[[str, str], object] | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.poll_s = poll_s
        self._senders = senders
        self._clock = clock
        self._rng = rng or random.Random()
        self._on_result = on_result
        self._session = requests.Session()
        install(self._session)
        self._deadlines = Deadlines()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._busy: set[int] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(self._senders, thread_name_prefix="webhook")
        self._thread = threading.Thread(target=self._run, name="webhooks", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """New deliveries were queued: look now."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop; attempts in flight are cut short (their deliveries stay pending)."""
        self._stop.set()
        self._wake.set()
        self._deadlines.abort_all()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._session.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # the queue stays; the next poll tries again
                _log.exception("webhook dispatch failed")
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def run_once(self) -> int:
        """Hand every due delivery (up to the free senders) to the pool; returns how many."""
        with self._lock:
            free = self._senders - len(self._busy)
        if free <= 0 or self._pool is None:
            return 0
        lease = self.policy.timeout_s * 3 + 5
        taken = self.store.claim(free, lease)
        for d in taken:
            with self._lock:
                self._busy.add(d.id)
            self._pool.submit(self._attempt_and_release, d)
        return len(taken)

    def _attempt_and_release(self, delivery: Delivery) -> None:
        try:
            self.attempt(delivery)
        except Exception:
            _log.exception("webhook delivery %d failed unexpectedly", delivery.id)
        finally:
            with self._lock:
                self._busy.discard(delivery.id)
            self._wake.set()

    def attempt(self, delivery: Delivery) -> bool:
        """One POST of ``delivery``; records the outcome. True when delivered."""
        body = delivery.body.encode("utf-8")
        headers = {
            "Content-Type": "application/json", "User-Agent": "edge-fleet-webhooks",
            "X-Edge-Event": delivery.event, "X-Edge-Delivery": str(delivery.id),
            SIGNATURE_HEADER: sign(delivery.secret, body),
        }
        status: int | None = None
        error = ""
        with self._deadlines.watch(self.policy.timeout_s) as watch:
            try:
                with self._session.post(delivery.url, data=body, headers=headers,
                                        timeout=self.policy.timeout_s, allow_redirects=False,
                                        stream=True) as resp:
                    status = resp.status_code
                    resp.raw.read(_ANSWER_BYTES)
            except (requests.RequestException, OSError) as exc:
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
        if watch.fired:
            status, error = None, f"no answer within the {self.policy.timeout_s:g} s deadline"
        if status is not None and 200 <= status < 300:
            self.store.delivered(delivery.id, status)
            self._count(delivery.event, "delivered")
            return True
        if status is not None:
            error = f"HTTP {status}"
        attempts = delivery.attempts + 1
        if attempts >= self.policy.max_attempts:
            self.store.failed(delivery.id, status, error, None)
            self._count(delivery.event, "dead")
            _log.warning("webhook delivery %d (%s to %s) is dead after %d attempts: %s",
                         delivery.id, delivery.event, delivery.url, attempts, error)
        else:
            retry = self._clock() + dt.timedelta(
                seconds=self.policy.delay_s(attempts, self._rng))
            self.store.failed(delivery.id, status, error, retry)
            self._count(delivery.event, "retry")
        return False

    def _count(self, event: str, outcome: str) -> None:
        if self._on_result is not None:
            self._on_result(event, outcome)
