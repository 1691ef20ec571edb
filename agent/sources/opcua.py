"""OPC UA source (asyncua client): a subscription's data changes become readings.

The source runs its own asyncio loop in the supervisor's source thread. Per connection it opens
a session (security policy and user from the config), resolves every node (NodeId text or
browse path), creates one subscription (OPC 10000-4 §5.13: publishing interval) with one
monitored item per node (§5.12: sampling interval, queue size) and then waits:

* **Readings.** The data changes of one publish response are collected and become one reading.
  It holds every channel's latest good value (sample and hold), and it is emitted once every
  channel has had a first value (the server sends each item's current value when the item is
  created). ``ts`` is the newest change's SourceTimestamp by default (``timestamp`` in the
  config); ``received_mono`` is when the publish arrived.
* **Rejected**, counted by reason and never emitted: ``status_bad`` and ``status_uncertain``
  (the value's StatusCode, OPC 10000-4 §7.39; the message names the code), ``wrong_type`` (not a
  number or bool), ``non_finite``, ``out_of_range`` (outside the node's ``min``/``max``).
* **Connection.** The client probes the server every ``watchdog_s``. When the connection is
  lost, refused, times out or is rejected (certificate, user), the source reports it
  (:class:`agent.sources.base.ReportsStatus`: one outage, red in /healthz) and reconnects with
  :class:`agent.sources.backoff.Backoff`; every reconnect re-creates the session, the node
  resolution and the subscription. The publishing intervals that passed while down are counted
  in ``edge_agent_polls_missed_total{reason="unreachable"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from agent.errors import RecordError, SourceError
from agent.records import Reading
from agent.secret_files import read_secret, warn_clear_password
from agent.sources.backoff import Backoff
from agent.sources.base import DeviceHooks, Emit, Reject, StatusListener
from agent.sources.opcua_config import NodeMap, OpcuaConfig

if TYPE_CHECKING:
    from agent.metrics import Metrics

#: How often the loop looks at the stop event, seconds.
STOP_POLL_S = 0.1


class _Lost(Exception):
    """Internal: the connection is gone (message = why)."""


class OpcuaSource(DeviceHooks):
    """Subscribes to OPC UA nodes; reconnects by itself; one reading per publish.

    Args:
        config: The ``opcua`` config (paths already absolute).
        stream: Stream name stamped on every reading.
        clock: Wall clock, epoch seconds (receive-time timestamps).
        monotonic: Monotonic clock, seconds.
        rng: Random source for the reconnect jitter.

    Attributes:
        stream, channels: As every source.
        connects: Sessions opened; publishes: publish responses that carried data changes.
        missed: Publishing intervals not received while the server was unreachable.
    """

    def __init__(
        self,
        config: OpcuaConfig,
        stream: str,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.stream = stream
        self.channels: tuple[str, ...] = tuple(n.channel for n in config.nodes)
        self._clock = clock
        self._monotonic = monotonic
        self._backoff = Backoff(config.reconnect_initial_s,
                                max(config.reconnect_max_s, config.reconnect_initial_s), rng=rng)
        self._listener: StatusListener | None = None
        self._metrics: Metrics | None = None
        self._values = np.full(len(self.channels), np.nan)
        self._pending: list[tuple[int, Any]] = []
        self._flush_scheduled = False
        self._lost_why = ""
        self.connects = 0
        self.publishes = 0
        self.missed = 0
        self._password = self._read_password(config, stream)
        # asyncua logs every failed request and reconnect attempt itself; the agent reports once.
        logging.getLogger("asyncua").setLevel(logging.CRITICAL)

    @staticmethod
    def _read_password(config: OpcuaConfig, stream: str) -> str | None:
        """The user's password, checked as ``[mqtt]``'s (:func:`agent.secret_files.read_secret`:
        a file others can write is a ConfigError, one they can read a warning) and warned about
        once when the session has no security policy and the server is not loopback (the
        password may then cross the network in clear, unless the server's token policy
        encrypts it)."""
        if config.username is None or config.password_file is None:
            return None
        key = f"stream {stream!r} source.password_file"
        password = read_secret(config.password_file, key, "password")
        if config.security_policy == "None":
            url = urlsplit(config.endpoint)
            try:
                port = url.port or 4840
            except ValueError:
                port = 4840
            warn_clear_password(key, url.hostname or "", port, config.username,
                                'set source.security_policy = "Basic256Sha256"')
        return password

    # -- the loop -------------------------------------------------------------------------------

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        """Subscribe until ``stop`` is set; never raises for a server that is down."""
        asyncio.run(self._main(emit, reject, stop))

    async def _main(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        down_since: float | None = None
        while not stop.is_set():
            lost = asyncio.Event()
            client: Any = None
            try:
                client = await self._connect(lost)
                await self._subscribe(client, emit, reject)
                self.connects += 1
                if down_since is not None:
                    self._count_missed(self._monotonic() - down_since)
                    down_since = None
                self._backoff.reset()
                self._report(None)
                while not stop.is_set() and not lost.is_set():
                    await asyncio.sleep(STOP_POLL_S)
                if lost.is_set():
                    raise _Lost(self._lost_why or "connection lost")
            except _Lost as exc:
                down_since = down_since if down_since is not None else self._monotonic()
                self._report(SourceError(f"OPC UA connection lost: {exc}", stream=self.stream,
                                         endpoint=self.config.endpoint))
            except Exception as exc:  # asyncua raises many kinds; each is one failed attempt
                down_since = down_since if down_since is not None else self._monotonic()
                self._report(SourceError(f"cannot subscribe at the OPC UA server: {_why(exc)}",
                                         stream=self.stream, endpoint=self.config.endpoint))
            finally:
                await _disconnect_quietly(client)
            if not stop.is_set():
                await self._sleep(self._backoff.next_delay(), stop)

    async def _sleep(self, seconds: float, stop: threading.Event) -> None:
        end = self._monotonic() + seconds
        while not stop.is_set() and self._monotonic() < end:
            await asyncio.sleep(min(STOP_POLL_S, max(0.0, end - self._monotonic())))

    async def _connect(self, lost: asyncio.Event) -> Any:
        from asyncua import ua  # noqa: PLC0415 - lazy: only when an opcua stream runs
        from asyncua.client.client import Client  # noqa: PLC0415

        cfg = self.config
        client = Client(cfg.endpoint, timeout=cfg.timeout_s, watchdog_intervall=cfg.watchdog_s,
                        auto_reconnect=False)
        client.session_timeout = max(60_000, int(cfg.publishing_interval_ms * 100))
        if cfg.security_policy != "None":
            from asyncua.crypto.security_policies import (  # noqa: PLC0415
                SecurityPolicyBasic256Sha256,
            )

            mode = (ua.MessageSecurityMode.SignAndEncrypt if cfg.security_mode == "SignAndEncrypt"
                    else ua.MessageSecurityMode.Sign)
            await client.set_security(SecurityPolicyBasic256Sha256, str(cfg.certificate_file),
                                      str(cfg.private_key_file),
                                      server_certificate=cfg.server_certificate_file, mode=mode)
        if cfg.username is not None and self._password is not None:
            client.set_user(cfg.username)
            client.set_password(self._password)

        async def on_lost(exc: Exception) -> None:
            self._lost_why = _why(exc)
            lost.set()

        client.connection_lost_callback = on_lost
        try:
            await asyncio.wait_for(client.connect(), timeout=cfg.timeout_s * 2)
        except TimeoutError as exc:
            await _disconnect_quietly(client)
            raise _Lost(f"no answer from {cfg.endpoint} within {cfg.timeout_s * 2:g} s") from exc
        return client

    async def _subscribe(self, client: Any, emit: Emit, reject: Reject) -> None:
        from asyncua import ua  # noqa: PLC0415

        resolved = [await self._resolve(client, n, i) for i, n in enumerate(self.config.nodes)]
        # one monitored item per distinct node; a node mapped to several channels feeds each
        index: dict[str, list[int]] = {}
        nodes, first = [], []
        for i, node in enumerate(resolved):
            if str(node.nodeid) not in index:
                nodes.append(node)
                first.append(i)
            index.setdefault(str(node.nodeid), []).append(i)
        loop = asyncio.get_running_loop()
        source = self

        class Handler:
            def datachange_notification(self, node: Any, val: Any, data: Any) -> None:
                for i in index[str(node.nodeid)]:
                    source._pending.append((i, data.monitored_item.Value))
                if not source._flush_scheduled:
                    source._flush_scheduled = True
                    loop.call_soon(source._flush, emit, reject)

            def status_change_notification(self, status: Any) -> None:
                with contextlib.suppress(Exception):
                    if not ua.StatusCode(status.Status).is_good():
                        client.uaclient.notify_transport_lost()

        sub = await client.create_subscription(self.config.publishing_interval_ms, Handler())
        results = await sub.subscribe_data_change(
            nodes, queuesize=self.config.queue_size,
            sampling_interval=self.config.sampling_interval_ms)
        for i, r in enumerate(results if isinstance(results, list) else [results]):
            if isinstance(r, ua.StatusCode) and not r.is_good():
                raise RuntimeError(f"node {self._where(self.config.nodes[first[i]])} cannot be "
                                   f"monitored: {r.name}")

    async def _resolve(self, client: Any, node: NodeMap, i: int) -> Any:
        if node.node_id is not None:
            found = client.get_node(node.node_id)
            await found.read_browse_name()  # fails here, not silently later, for an unknown id
            return found
        steps = [s for s in (node.browse_path or "").split("/") if s]
        return await client.nodes.root.get_child(steps)

    @staticmethod
    def _where(node: NodeMap) -> str:
        return node.node_id or f"at browse path {node.browse_path}"

    # -- notifications --------------------------------------------------------------------------

    def _flush(self, emit: Emit, reject: Reject) -> None:
        """Turn the collected changes of one publish into (at most) one reading."""
        pending, self._pending, self._flush_scheduled = self._pending, [], False
        received_mono = self._monotonic()
        newest: float | None = None
        changed = False
        for i, dv in pending:
            try:
                value = self._value(i, dv)
            except RecordError as exc:
                reject(exc)
                continue
            self._values[i] = value
            changed = True
            ts = self._timestamp(dv)
            newest = ts if newest is None or (ts is not None and ts > newest) else newest
        if not changed or np.isnan(self._values).any():
            return
        self.publishes += 1
        emit(Reading(self.stream, newest if newest is not None else self._clock(),
                     self._values.copy(), received_mono=received_mono))

    def _value(self, i: int, dv: Any) -> float:
        node = self.config.nodes[i]
        code = dv.StatusCode
        if code is not None and not code.is_good():
            kind = "status_uncertain" if code.is_uncertain() else "status_bad"
            raise RecordError(f"{node.channel} ({self._where(node)}): {code.name}", reason=kind)
        raw = dv.Value.Value if dv.Value is not None else None
        if isinstance(raw, bool):
            raw = float(raw)
        if not isinstance(raw, int | float):
            raise RecordError(f"{node.channel}: {type(raw).__name__} value is not a number",
                              reason="wrong_type")
        value = float(raw)
        if not math.isfinite(value):
            raise RecordError(f"{node.channel}: non-finite value {value}", reason="non_finite")
        if (node.min is not None and value < node.min) or (node.max is not None
                                                            and value > node.max):
            low = -math.inf if node.min is None else node.min
            high = math.inf if node.max is None else node.max
            raise RecordError(f"{node.channel}: {value:g} outside [{low:g}, {high:g}]",
                              reason="out_of_range")
        return value

    def _timestamp(self, dv: Any) -> float | None:
        mode = self.config.timestamp
        if mode == "receive":
            return self._clock()
        stamps = [dv.SourceTimestamp, dv.ServerTimestamp] if mode == "source" else [
            dv.ServerTimestamp]
        for s in stamps:
            if isinstance(s, dt.datetime):
                return (s if s.tzinfo else s.replace(tzinfo=dt.timezone.utc)).timestamp()
        return self._clock()

    def _count_missed(self, down_s: float) -> None:
        n = int(down_s * 1000.0 / self.config.publishing_interval_ms)
        if n <= 0:
            return
        self.missed += n
        if self._metrics is not None:
            self._metrics.polls_missed_total.labels(stream=self.stream,
                                                    reason="unreachable").inc(n)


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


async def _disconnect_quietly(client: Any) -> None:
    if client is None:
        return
    with contextlib.suppress(Exception):  # already broken; nothing more to report
        await asyncio.wait_for(client.disconnect(), timeout=2.0)
