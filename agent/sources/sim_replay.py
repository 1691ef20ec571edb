"""Serve a recorded CSV row by row in real time: the pacing shared by the device simulators.

``edge-agent sim-modbus`` (:mod:`agent.sources.modbus_sim`) writes each row into holding
registers, ``edge-agent sim-opcua`` (:mod:`agent.sources.opcua_sim`) into OPC UA variables;
both read the file with :class:`agent.sources.replay.ReplaySource` (its parser and its pacing:
``speed`` 1 = the file's own timestamps) and hand each row to a ``write`` callback.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from agent.errors import SourceExhausted
from agent.records import Reading


def csv_channels(path: str) -> tuple[str, ...]:
    """The channel names of a recording, in column order.

    Raises:
        SourceError: When the file cannot be read.
    """
    from agent.sources.replay import ReplayConfig, ReplaySource  # noqa: PLC0415

    return ReplaySource(ReplayConfig(path=path), "sim").channels


def play_csv(
    path: str,
    write: Callable[[Reading], None],
    *,
    speed: float = 1.0,
    loop: bool = True,
    stop: threading.Event | None = None,
    check: Callable[[tuple[str, ...]], None] | None = None,
) -> tuple[str, ...]:
    """Call ``write`` with each row of ``path`` at its time until the end or ``stop``.

    Rows are restamped with the current time (a device serves the present, not 2019).

    Args:
        path: The CSV file (SKAB layout: a datetime column, then one column per channel).
        write: Called with each row, in order, from this thread.
        speed: 1.0 = the file's own pace, N = N times faster.
        loop: Start again at the end of the file.
        stop: Set to return.
        check: Called with the channel names before the first row (may raise).

    Returns:
        The channel names (when the file ends or ``stop`` is set).

    Raises:
        SourceError: When the file cannot be read.
    """
    from agent.sources.replay import ReplayConfig, ReplaySource  # noqa: PLC0415

    replay = ReplaySource(ReplayConfig(path=path, speed=speed, loop=loop, restamp=True), "sim")
    if check is not None:
        check(replay.channels)
    with contextlib.suppress(SourceExhausted):  # the end of a file served once
        replay.run(write, lambda _error: None, stop if stop is not None else threading.Event())
    return replay.channels
