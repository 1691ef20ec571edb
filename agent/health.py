"""Health: green/yellow/red per component with a reason, and the stall policy (pure code).

A component is *green* when it works as configured, *yellow* when it works but needs a look
(calibrating, a quiet serial port, a slowly draining outbox, a store close to its budget, a
finite source that ended), *red* when it does not do its job (source down or stalled, pipeline
stuck, broker unreachable). Every non-green component carries the reason. The overall state is
the worst component's; ``/healthz`` answers HTTP 200 for green and yellow, 503 for red.

Stall policy (which silence counts as "stuck", :func:`stall_policy`):

* a paced source (``simulator``, ``replay``) is expected to produce a reading every
  ``1 / (rate x speed)`` seconds; no reading for ``max(10 x period, 30 s)`` while its thread is
  alive and not in a reported outage means the reader is stuck: the component is red and the
  systemd watchdog stops (a restart is the cure for a wedged reader). ``speed = 0`` (as fast as
  possible) uses the 30 s floor;
* a ``serial`` source (and any live device source a plugin adds: ``modbus`` ...) may
  legitimately be quiet (an idle machine, a device that reports on
  change): silence past the same limit (period from the model's ``sample_rate_hz``) only makes it
  yellow ("quiet") and never stops the watchdog; a lost port is reported by the source itself
  (an outage, red);
* a source waiting by design (:class:`agent.sources.base.ReportsWaits`: a replay paced over a
  gap in its recording, a simulator at a slow rate) is no stall while it waits: its silence
  counts from the time its next reading is due, so a 65 s gap in a recording keeps the
  watchdog fed, and a reader still silent ``limit`` seconds after that is stuck as any other;
* ``streams.stall_after_s`` overrides the limit for any kind, and makes silence past it stop the
  watchdog even for serial (use it when the device is known to talk continuously);
* a source in a reported outage (port gone, file missing) is red but does not stop the watchdog:
  the supervisor is retrying, and restarting the process would not bring the device back;
* a ``camera`` source reconnects by itself when no frame came for its ``stall_s`` (a stalled or
  failing capture is a reported outage: red, watchdog kept; a recorded file at ``fps`` = 0 is
  never reopened, and its reader waiting for a slow model is no stall); progress is a frame
  handed to the
  model, so frames not coming for ``max(2 x stall_s, 10 frame periods, 30 s)`` *without* an
  outage means the stream's thread is stuck (red, watchdog stopped). :func:`camera_stall_policy`;
* a source that failed for good (a fatal error, a camera file that cannot be read) is red and
  stops the watchdog; when every source has ended the agent exits instead (69, with one
  failed: :mod:`agent.exitcodes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from agent.sources.camera import CameraConfig
from agent.sources.replay import ReplayConfig
from agent.sources.simulator import SimulatorConfig

State = Literal["green", "yellow", "red"]
GREEN: State = "green"
YELLOW: State = "yellow"
RED: State = "red"
_RANK: dict[State, int] = {GREEN: 0, YELLOW: 1, RED: 2}

#: A paced source is stalled after this many expected sample periods without a reading ...
STALL_PERIODS = 10
#: ... but never sooner than this many seconds.
MIN_STALL_S = 30.0


def rank(state: State) -> int:
    """0 green, 1 yellow, 2 red (the ``edge_agent_health_state`` value).

    >>> rank("yellow")
    1
    """
    return _RANK[state]


def worst(states: Iterable[State]) -> State:
    """The worst of ``states`` (green for none).

    >>> worst(["green", "red", "yellow"])
    'red'
    >>> worst([])
    'green'
    """
    return max(states, key=rank, default=GREEN)


@dataclass(frozen=True)
class Component:
    """One component's health.

    Attributes:
        name: ``source:<stream>``, ``calibration``, ``pipeline``, ``mqtt``, ``store``,
            ``uploader``.
        state: green, yellow or red.
        reason: Why the state is not green (None when green).
        details: Figures behind the state (ages in seconds, depths, bytes).
    """

    name: str
    state: State
    reason: str | None = None
    details: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """The health of every component at one moment.

    Attributes:
        components: One per component, in a stable order.
        at: Wall time of the report, epoch seconds UTC.
    """

    components: tuple[Component, ...]
    at: float

    @property
    def overall(self) -> State:
        """The worst component state."""
        return worst(c.state for c in self.components)

    @property
    def http_status(self) -> int:
        """200 for green or yellow, 503 for red."""
        return 503 if self.overall == RED else 200

    def to_json(self) -> dict[str, object]:
        """The ``/healthz`` body: ``{"status", "at", "components": {name: {state, reason, …}}}``."""
        return {
            "status": self.overall,
            "at": round(self.at, 3),
            "components": {
                c.name: {"state": c.state, "reason": c.reason, **c.details}
                for c in self.components
            },
        }

    def replace(self, component: Component) -> Report:
        """A copy with ``component`` replacing the one of the same name (or appended)."""
        comps = [c for c in self.components if c.name != component.name]
        index = next(
            (i for i, c in enumerate(self.components) if c.name == component.name), len(comps)
        )
        comps.insert(index, component)
        return Report(tuple(comps), self.at)


@dataclass(frozen=True)
class StallPolicy:
    """When a source's silence is a stall.

    Attributes:
        limit_s: Seconds without a reading after which the source is stalled (or quiet).
        stops_watchdog: True when a stall is red and stops the systemd watchdog; False when
            silence is legitimate and only shown as yellow.
    """

    limit_s: float
    stops_watchdog: bool


def stall_policy(
    source: object,
    model_rate_hz: float,
    override_s: float | None = None,
) -> StallPolicy:
    """The stall policy of one stream (see the module docstring).

    Args:
        source: The stream's source config.
        model_rate_hz: The model's nominal sample rate (manifest ``input.sample_rate_hz``), Hz.
        override_s: ``streams.stall_after_s``; None = derived.

    >>> stall_policy(SimulatorConfig(sample_rate_hz=1.0, speed=20.0), 1.0)
    StallPolicy(limit_s=30.0, stops_watchdog=True)
    >>> stall_policy(SimulatorConfig(sample_rate_hz=0.1, speed=1.0), 1.0)
    StallPolicy(limit_s=100.0, stops_watchdog=True)
    >>> from agent.sources.serial import SerialConfig
    >>> stall_policy(SerialConfig(port="/dev/ttyUSB0", channels=["a"]), 1.0)
    StallPolicy(limit_s=30.0, stops_watchdog=False)
    >>> stall_policy(SerialConfig(port="/dev/ttyUSB0", channels=["a"]), 1.0, override_s=5.0)
    StallPolicy(limit_s=5.0, stops_watchdog=True)
    """
    if override_s is not None:
        return StallPolicy(override_s, True)
    if isinstance(source, SimulatorConfig):
        rate, speed = source.sample_rate_hz, source.speed
    else:
        rate, speed = model_rate_hz, getattr(source, "speed", 1.0)
    period = 1.0 / (rate * speed) if speed > 0 and rate > 0 else 0.0
    limit = max(STALL_PERIODS * period, MIN_STALL_S)
    # a live device (serial, or a plugin's: Modbus ...) may be quiet or down: yellow, no restart
    return StallPolicy(limit, isinstance(source, ReplayConfig | SimulatorConfig))


def camera_stall_policy(source: CameraConfig, override_s: float | None = None) -> StallPolicy:
    """The stall policy of a camera stream (see the module docstring).

    Args:
        source: The stream's ``camera`` source config.
        override_s: ``streams.stall_after_s``; None = derived.

    >>> camera_stall_policy(CameraConfig(device=0, stall_s=5.0))
    StallPolicy(limit_s=30.0, stops_watchdog=True)
    >>> camera_stall_policy(CameraConfig(folder="f", fps=0.2, stall_s=20.0))
    StallPolicy(limit_s=50.0, stops_watchdog=True)
    >>> camera_stall_policy(CameraConfig(device=0), override_s=12.0)
    StallPolicy(limit_s=12.0, stops_watchdog=True)
    """
    if override_s is not None:
        return StallPolicy(override_s, True)
    live = source.device is not None or source.url is not None
    period = 1.0 / source.fps if source.fps > 0 and not live else 0.0
    return StallPolicy(max(2 * source.stall_s, STALL_PERIODS * period, MIN_STALL_S), True)


@dataclass(frozen=True)
class SourceView:
    """What the supervisor knows about one source (all ages in seconds).

    Attributes:
        started: The supervisor thread was started.
        alive: Its thread runs.
        done: A finite input ended.
        error: The fatal error that ended the thread, if any.
        outage: The retryable failure in progress, if any.
        outage_age_s: How long the outage has lasted.
        progress_age_s: Since the last reading (or since start when none yet), or since the
            due time of the next reading when the source waits by design and that is later.
        waiting_s: Seconds until the next reading is due while the source waits by design
            (0 when it does not).
        silence_s: Since the last reading (or the start), whatever the source waits for;
            None = ``progress_age_s``.
    """

    started: bool
    alive: bool
    done: bool
    error: str | None
    outage: str | None
    outage_age_s: float
    progress_age_s: float
    waiting_s: float = 0.0
    silence_s: float | None = None

    @classmethod
    def observe(cls, now: float, *, started_mono: float | None, last_progress_mono: float | None,
                alive: bool, done: bool, error: str | None,
                outage: tuple[str, float] | None,
                waiting_until_mono: float | None = None) -> SourceView:
        """The view at ``now`` (monotonic seconds) of a source thread: ``outage`` is its
        ``(error text, monotonic start)`` in progress; ages count from the last progress, else
        from the start, or from ``waiting_until_mono`` (the next reading's due time while the
        source waits by design) when that is later.

        >>> v = SourceView.observe(100.0, started_mono=0.0, last_progress_mono=10.0, alive=True,
        ...                        done=False, error=None, outage=None, waiting_until_mono=120.0)
        >>> v.progress_age_s, v.waiting_s, v.silence_s
        (0.0, 20.0, 90.0)
        """
        last = last_progress_mono or started_mono or now
        since = last if waiting_until_mono is None else max(last, waiting_until_mono)
        return cls(
            started=started_mono is not None,
            alive=alive,
            done=done,
            error=error,
            outage=None if outage is None else outage[0],
            outage_age_s=0.0 if outage is None else max(0.0, now - outage[1]),
            progress_age_s=max(0.0, now - since),
            waiting_s=0.0 if waiting_until_mono is None else max(0.0, waiting_until_mono - now),
            silence_s=max(0.0, now - last),
        )


def source_health(stream: str, view: SourceView, policy: StallPolicy) -> tuple[Component, bool]:
    """One source's component and whether it blocks the watchdog.

    >>> v = SourceView(True, True, False, None, None, 0.0, 45.0)
    >>> c, blocks = source_health("p1", v, StallPolicy(30.0, True))
    >>> c.state, blocks, c.reason
    ('red', True, 'stalled: no reading for 45 s (limit 30 s); the reader looks stuck')
    >>> source_health("p1", v, StallPolicy(30.0, False))[0].state
    'yellow'
    """
    name = f"source:{stream}"
    details: dict[str, object] = {
        "last_reading_age_s": round(
            view.progress_age_s if view.silence_s is None else view.silence_s, 1),
        "stall_limit_s": policy.limit_s,
    }
    if view.waiting_s > 0:
        details["next_reading_due_in_s"] = round(view.waiting_s, 1)
    age = view.progress_age_s
    if not view.started:
        return Component(name, GREEN, None, details), False
    if view.done:
        return Component(name, YELLOW, "exhausted: the finite input has ended", details), False
    if view.error is not None:
        return Component(name, RED, f"failed for good: {view.error}", details), True
    if not view.alive:
        return Component(name, RED, "reader thread has ended", details), True
    if view.outage is not None:
        reason = f"down for {view.outage_age_s:.0f} s: {view.outage}; retrying with backoff"
        return Component(name, RED, reason, details), False
    if age > policy.limit_s:
        if policy.stops_watchdog:
            reason = (
                f"stalled: no reading for {age:.0f} s (limit {policy.limit_s:.0f} s); "
                "the reader looks stuck"
            )
            return Component(name, RED, reason, details), True
        reason = (
            f"quiet: no reading for {age:.0f} s (a serial device may be idle; the port is open)"
        )
        return Component(name, YELLOW, reason, details), False
    return Component(name, GREEN, None, details), False
