"""The uploader's failure episodes: backoff with full jitter, the log-once state of an outage,
token refresh after a 401/403, and the rejection reasons already logged.

Backoff (:class:`agent.sources.backoff.Backoff`): ``delay = U(0, min(max, initial * 2**n))``
(Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog, 2015), at least the
server's ``Retry-After``. The upload loop and the failure policy: :mod:`agent.services.uploader`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.errors import ConfigError
from agent.metrics import Metrics
from agent.sources.backoff import Backoff
from cloud_sync.errors import FleetAuthError, FleetRejected, FleetUnavailable

log = logging.getLogger("agent.uploader")

#: Distinct rejection reasons remembered for log-once (then every new one is logged again).
REASONS_REMEMBERED = 256
#: Consecutive failed attempts after which the uploader needs a look (``/healthz`` yellow) ...
FAILURE_STREAK = 3
#: ... or failed attempts for longer than this many ``backoff_max_s`` without a success.
FAILING_BACKOFFS = 2


def failure_reason(exc: Exception) -> str:
    """The ``upload_failures_total`` reason of a fleet error (as the uploader counts it)."""
    if isinstance(exc, FleetAuthError):
        return "auth"
    if isinstance(exc, FleetRejected):
        return "rejected"
    if isinstance(exc, FleetUnavailable):
        return "unavailable"
    return "protocol"


@dataclass
class _Outage:
    """Log-once state of a failure episode."""

    since: float | None = None
    attempts: int = 0
    last_error: str | None = None
    auth_logged: bool = False
    reasons: set[str] = field(default_factory=set)


class UploadFailures:
    """Failure state of one :class:`agent.services.uploader.Uploader`.

    Args:
        backoff: The retry delays (``initial_s`` after a new token, ``max_s`` after a 401/403).
        metrics: ``upload_failures_total{reason}``.
        device_id: This gateway's id (named in the 403 log line).
        clock: Wall clock, epoch seconds UTC (outage start).
        refresh_gauges: Refreshes the backlog gauges (after each failure: the backlog that
            :meth:`streak` names).
        refresh_token: Reads the token again after a 401/403, True when it changed; may raise
            ConfigError; None = never.

    Attributes:
        failing: The last attempt failed (the loop waits out the backoff, not the idle wait).
        deadline_failure: Why the last failure needs a look (a request cut off at its
            deadline), None once an upload succeeds.

    A failure episode needs a look (:meth:`streak`) once ``FAILURE_STREAK`` consecutive
    attempts failed, or attempts have failed for longer than ``FAILING_BACKOFFS`` x
    ``backoff_max_s`` (a 401/403 retried every ``backoff_max_s``); the first success ends it.
    """

    def __init__(
        self,
        backoff: Backoff,
        metrics: Metrics,
        device_id: str,
        clock: Callable[[], float],
        refresh_gauges: Callable[[], object],
        refresh_token: Callable[[], bool] | None = None,
    ) -> None:
        self._backoff = backoff
        self.metrics = metrics
        self.device_id = device_id
        self.clock = clock
        self._refresh_gauges = refresh_gauges
        self._refresh_token = refresh_token
        self.failing = False
        self.deadline_failure: str | None = None
        self._outage = _Outage()

    def first_rejection(self, key: str) -> bool:
        """True the first time ``key`` (``<kind>:<reason>``) is seen (log it then); at most
        ``REASONS_REMEMBERED`` are remembered."""
        if key in self._outage.reasons:
            return False
        if len(self._outage.reasons) >= REASONS_REMEMBERED:
            self._outage.reasons.clear()
        self._outage.reasons.add(key)
        return True

    def failed(self, reason: str, message: str, retry_after_s: float | None) -> float:
        """A failed attempt (``upload_failures_total{reason}``; the episode's first logged):
        the backoff delay in seconds, at least ``retry_after_s``."""
        self.metrics.upload_failures_total.labels(reason=reason).inc()
        o = self._outage
        o.attempts += 1
        o.last_error = message
        if o.since is None:
            o.since = self.clock()
            log.warning(
                "upload failed (%s): %s; records stay in the store, retrying with backoff",
                reason, message,
            )
        self.failing = True
        delay = self._backoff.next_delay()
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        self._refresh_gauges()
        return delay

    def auth_failed(self, exc: FleetAuthError) -> float:
        """A 401/403: read the token again (a new one: retry after the first backoff step),
        else log once and retry after ``backoff_max_s``; returns the delay in seconds."""
        self.metrics.upload_failures_total.labels(reason="auth").inc()
        o = self._outage
        o.attempts += 1
        o.last_error = f"HTTP {exc.status}: {exc.detail}"
        if o.since is None:
            o.since = self.clock()
        if self._refresh_token is not None:
            try:
                changed = self._refresh_token()
            except ConfigError as cfg_exc:
                changed = False
                if not o.auth_logged:
                    log.error("fleet: cannot read the device token again: %s", cfg_exc)
            if changed:
                log.warning("fleet: the device token was refused (HTTP %d); a new token was "
                            "found and is used from the next attempt", exc.status)
                o.auth_logged = False
                self.failing = True
                self._refresh_gauges()
                return self._backoff.initial_s
        if not o.auth_logged and exc.status == 403 and "device_id" in exc.detail:
            o.auth_logged = True  # the token is valid; the config's device_id is not its device
            log.error(
                "fleet refused batches of device_id %r (HTTP 403): %s; re-enrolling does not "
                "help; retrying every %.0f s (the config is read again on SIGHUP)",
                self.device_id, exc.detail, self._backoff.max_s,
            )
        if not o.auth_logged:
            o.auth_logged = True
            log.error(
                "fleet refused the device token (HTTP %d: %s); re-enroll the device "
                "(edge-fleet device add) and update the token (read again at every retry, "
                "or at once on SIGHUP); retrying every %.0f s",
                exc.status, exc.detail, self._backoff.max_s,
            )
        self.failing = True
        self._refresh_gauges()
        return self._backoff.max_s

    def streak(self, backlog: tuple[int, int]) -> str | None:
        """Why the failure episode in progress needs a look, or None (no episode, or still
        short: see the class docstring). ``backlog`` is ``(alerts, aggregates)`` waiting.

        >>> from prometheus_client import CollectorRegistry
        >>> f = UploadFailures(Backoff(1.0, 8.0), Metrics(CollectorRegistry()), "gw1",
        ...                    lambda: 100.0, lambda: None)
        >>> for _ in range(2):
        ...     _ = f.failed("unavailable", "connection refused", None)
        >>> f.streak((2, 40)) is None
        True
        >>> _ = f.failed("unavailable", "connection refused", None)
        >>> text = f.streak((2, 40))
        >>> text.startswith("uploads failing: 3 consecutive attempts failed over 0 s, the last: "
        ...                 "connection refused; 2 alert(s) and 40 aggregate(s) wait")
        True
        """
        o = self._outage
        since, attempts = o.since, o.attempts
        if since is None or attempts == 0:
            return None
        age = max(0.0, self.clock() - since)
        if attempts < FAILURE_STREAK and age <= FAILING_BACKOFFS * self._backoff.max_s:
            return None
        return (f"uploads failing: {attempts} consecutive attempts failed over "
                f"{age:.0f} s, the last: {o.last_error}; {backlog[0]} alert(s) and "
                f"{backlog[1]} aggregate(s) wait on the device (retrying with backoff)")

    def recovered(self) -> None:
        """An upload succeeded: log the end of the episode, reset the backoff."""
        o = self._outage
        if o.since is not None:
            log.warning(
                "upload recovered after %.1f s and %d failed attempt(s)",
                self.clock() - o.since, o.attempts,
            )
        self._outage = _Outage(reasons=o.reasons)
        self.deadline_failure = None
        self.failing = False
        self._backoff.reset()
