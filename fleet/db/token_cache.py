"""In-process cache of successful device-token authentications (``cachetools.TTLCache``).

Every ingest request carries a device token; looking its hash up in the database costs a pooled
connection and round trips per request. :class:`TokenCache` remembers, per process, which
device a token hash belongs to for ``ttl_s`` seconds after the lookup that found it.

Keys are ``sha256(token)`` hex digests (:func:`fleet.db.devices.hash_token`), never the raw
token. Only successes are cached: an unknown or revoked token is looked up every time, so a
device enrolled in another process authenticates at once.

Revocation semantics:

* the process that revokes a device (``DELETE /v1/devices/{id}`` handled by that worker)
  drops the device's entries at once: its next request there is refused;
* on PostgreSQL every other process, on any host, drops them when the revoking transaction
  commits: the revoke sends ``pg_notify`` in that transaction and each process's
  :class:`fleet.db.invalidation.InvalidationListener` calls :meth:`TokenCache.drop_device`.
  While a process's listener is not connected its cache is :meth:`suspended <TokenCache.suspend>`
  (every request asks the database), and it starts empty when the listener (re)connects, since
  notifications sent in between are lost;
* on SQLite (one host) every other process (the other ``serve --workers`` workers, or any
  worker when the operator ran ``edge-fleet device revoke``) keeps accepting the revoked token
  for at most ``ttl_s`` seconds after it last looked the token up in the database.

TTL: on SQLite ``ttl_s`` is :attr:`fleet.settings.Settings.auth_cache_ttl_s` (``serve
--auth-cache-ttl``, default 30 s), the revocation delay of the other processes. On PostgreSQL the
listener, not the TTL, ends a revoked entry, so entries live :func:`effective_ttl_s` (at least
:data:`LISTENED_TTL_S`, 1 h): a device is looked up in the database about once an hour per
process instead of every ``ttl_s`` (its requests come every 20-60 s). 0 disables the cache on
either database (every request looks the token up).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cachetools import TTLCache

#: Default seconds a successful authentication is reused (the revocation delay in other
#: processes, see the module docstring).
DEFAULT_TTL_S = 30.0
#: Least seconds an entry lives when an invalidation listener drops revoked entries
#: (PostgreSQL): the TTL then only bounds how long a device that went away stays cached.
LISTENED_TTL_S = 3600.0
#: Most cached tokens per process (a fleet's active devices; past it the least recently used
#: entry is dropped and simply looked up again).
DEFAULT_MAX_ENTRIES = 100_000


def effective_ttl_s(ttl_s: float, listened: bool) -> float:
    """Seconds an entry lives: ``ttl_s`` (the setting), raised to :data:`LISTENED_TTL_S` when
    an invalidation listener feeds the cache (``listened``); 0 stays 0 (cache off).

    >>> effective_ttl_s(30.0, False), effective_ttl_s(30.0, True), effective_ttl_s(0.0, True)
    (30.0, 3600.0, 0.0)
    """
    if ttl_s <= 0:
        return 0.0
    return max(ttl_s, LISTENED_TTL_S) if listened else ttl_s


class TokenCache:
    """Thread-safe map ``token sha256 hex -> device id`` whose entries expire.

    Args:
        ttl_s: Seconds an entry lives after :meth:`put` (> 0; use no cache for 0).
        max_entries: Most entries held.
        timer: Monotonic seconds (injected for tests).
        suspended: Start suspended (:meth:`suspend`): a cache that waits for its invalidation
            listener to connect.

    Attributes:
        ttl_s: Seconds an entry lives (as given).

    Raises:
        ValueError: ``ttl_s`` is not positive or ``max_entries`` is below 1.
    """

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        timer: Callable[[], float] = time.monotonic,
        *,
        suspended: bool = False,
    ) -> None:
        if not ttl_s > 0 or max_entries < 1:
            raise ValueError("ttl_s must be > 0 and max_entries >= 1")
        self.ttl_s = ttl_s
        self._entries: TTLCache[str, str] = TTLCache(max_entries, ttl_s, timer=timer)
        self._lock = threading.Lock()
        self._drops = 0  # drop_device/suspend/resume calls so far (see put)
        self._suspended = suspended

    @property
    def suspended(self) -> bool:
        """True while the cache holds and answers nothing (:meth:`suspend`)."""
        with self._lock:
            return self._suspended

    def get(self, digest: str) -> str | None:
        """The device id cached for ``digest``, or None (never seen, expired, dropped or
        suspended)."""
        with self._lock:
            return None if self._suspended else self._entries.get(digest)

    def generation(self) -> int:
        """A stamp to take before a database lookup and hand to :meth:`put`."""
        with self._lock:
            return self._drops

    def put(self, digest: str, device_id: str, generation: int) -> None:
        """Remember that ``digest`` authenticated ``device_id`` (for ``ttl_s`` from now).

        Skipped when :meth:`drop_device` ran since ``generation`` was taken: the lookup may
        have read the token before a revocation committed, and must not cache it afterwards.
        """
        with self._lock:
            if generation == self._drops and not self._suspended:
                self._entries[digest] = device_id

    def suspend(self) -> None:
        """Forget every entry and cache nothing until :meth:`resume` (revocations may be
        missed: the invalidation listener lost its connection)."""
        with self._lock:
            self._drops += 1
            self._suspended = True
            self._entries.clear()

    def resume(self) -> None:
        """Start caching again, empty (a lookup begun before this call is not cached)."""
        with self._lock:
            self._drops += 1
            self._suspended = False
            self._entries.clear()

    def drop_device(self, device_id: str) -> None:
        """Forget every entry of ``device_id`` (its token was revoked or replaced)."""
        with self._lock:
            self._drops += 1
            stale = [k for k in list(self._entries) if self._entries.get(k) == device_id]
            for key in stale:
                self._entries.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
