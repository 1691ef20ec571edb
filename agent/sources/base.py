"""The Source role: one interface every ingest plugin implements.

A source runs in its own thread, started by the supervisor (:mod:`agent.services.supervisor`).
It calls ``emit`` for every accepted reading and ``reject`` for every record it refuses; it never
logs per record (the supervisor counts and rate-limits). It returns when ``stop`` is set, and
raises :class:`agent.errors.SourceError` when its input fails (retryable: the supervisor retries
with backoff) or :class:`agent.errors.SourceExhausted` when a finite input ends.

A source that heals its own input inside ``run`` (the serial port reconnects by itself) also
implements :class:`ReportsStatus`, so the supervisor can still count, log and expose its outages:
it calls the listener with a :class:`agent.errors.SourceError` for every failed attempt and with
``None`` once the input works again.

A source whose thread must never wait on a full pipeline (it also runs a network protocol's
keepalive, as paho's loop does for MQTT) implements :class:`TakesOffer`: it hands readings over
with ``offer(reading, wait_s)``, which waits at most ``wait_s`` seconds and says whether the
reading was taken, and keeps what was not taken to offer it again.

A source that waits by design (pacing a recording or a simulation in real time, a gap in a
recording, a slow poll interval) implements :class:`ReportsWaits`: it says until when it waits,
so the watchdog does not take the silence for a stuck reader (:mod:`agent.health`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agent.config.base import StrictModel
from agent.errors import RecordError, SourceError
from agent.records import Reading

if TYPE_CHECKING:
    from agent.metrics import Metrics

Emit = Callable[[Reading], None]
Reject = Callable[[RecordError], None]
StatusListener = Callable[[SourceError | None], None]
#: ``offer(reading, wait_s)``: hand a reading over, waiting at most ``wait_s`` seconds for room;
#: True once it is taken (queued, or rejected and counted), False when there was no room in time.
Offer = Callable[[Reading, float], bool]
#: Called with the monotonic time (seconds) the next reading is due before a wait by design,
#: and with None when the wait is over.
WaitListener = Callable[[float | None], None]


class Source(Protocol):
    """A stream of multichannel readings.

    Attributes:
        stream: The stream name the readings carry.
        channels: Channel names, in the order of ``Reading.values``.
    """

    stream: str
    channels: tuple[str, ...]

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        """Read until ``stop`` is set; see the module docstring for the error contract."""
        ...


@runtime_checkable
class ReportsStatus(Protocol):
    """Optional: a source that retries internally and reports its outages and recoveries."""

    def set_status_listener(self, listener: StatusListener | None) -> None:
        """Call ``listener(error)`` per failed attempt and ``listener(None)`` on recovery."""
        ...


@runtime_checkable
class ReportsWaits(Protocol):
    """Optional: a source that waits by design says so (gaps, pacing, poll intervals)."""

    def set_wait_listener(self, listener: WaitListener | None) -> None:
        """Call ``listener(due_mono)`` before each wait by design and ``listener(None)`` after."""
        ...


@runtime_checkable
class TakesOffer(Protocol):
    """Optional: a source that must not block on a full queue (module docstring)."""

    def set_offer(self, offer: Offer | None) -> None:
        """Hand readings over with ``offer`` instead of the (blocking) ``emit``."""
        ...


def paced_wait(
    wait: Callable[[float], object], delay: float, now_mono: float,
    listener: WaitListener | None,
) -> None:
    """``wait(delay)``, announced to ``listener`` as due at ``now_mono + delay`` (monotonic s)."""
    if listener is not None:
        listener(now_mono + delay)
    try:
        wait(delay)
    finally:
        if listener is not None:
            listener(None)


@runtime_checkable
class UsesMetrics(Protocol):
    """Optional: a source that exports metrics of its own (poll jitter, overruns ...)."""

    def set_metrics(self, metrics: Metrics) -> None:
        """Called by the supervisor before ``run`` with the agent's metrics."""
        ...


class DeviceHooks:
    """Mixin of a live device source that heals its own connection (Modbus, OPC UA, MQTT in):
    the :class:`ReportsStatus` and :class:`UsesMetrics` halves the supervisor calls, and
    ``_report`` for the source itself (a SourceError per failed attempt, None on recovery)."""

    _listener: StatusListener | None = None
    _metrics: Metrics | None = None

    def set_status_listener(self, listener: StatusListener | None) -> None:
        """Receive a SourceError per failed connect or lost connection, None once it works."""
        self._listener = listener

    def set_metrics(self, metrics: Metrics) -> None:
        """Export the source's own metrics (poll timing, missed intervals, events) there."""
        self._metrics = metrics

    def _report(self, error: SourceError | None) -> None:
        if self._listener is not None:
            self._listener(error)


@dataclass(frozen=True, slots=True)
class SourcePlugin:
    """One source kind, as an entry point of the group ``edge_agent.sources`` names it.

    A package adds a kind by declaring, in its own metadata (setup.cfg)::

        [options.entry_points]
        edge_agent.sources =
            lidar = my_package.lidar:PLUGIN

    where ``PLUGIN = SourcePlugin("lidar", LidarConfig, "my_package.lidar:LidarSource")``.
    The built-in kinds are declared the same way (:mod:`agent.sources.registry`).

    Attributes:
        kind: The ``[streams.source] kind`` value; equal to the entry point's name.
        config: The kind's strict config model; its ``kind`` field is ``Literal[kind]`` with
            ``kind`` as default.
        implementation: ``"module:Class"`` of the :class:`Source`, imported only when a stream
            uses the kind (its heavy dependencies load only then); the class is called as
            ``Class(config, stream, **dependencies)``.
        path_fields: Config fields holding file paths, made absolute relative to the config
            file's directory (:meth:`agent.config.schema.AgentConfig.resolved`).
    """

    kind: str
    config: type[StrictModel]
    implementation: str
    path_fields: tuple[str, ...] = ()
