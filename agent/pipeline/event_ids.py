"""Alert ids of recorded inputs: the same input replayed gives the same ids.

The rule (docs/mqtt.md, "Alert ids"): an event of a **live** source (serial, Modbus, OPC UA,
MQTT in, a camera device or URL, a watched folder, a simulator, a replay with ``restamp`` or
``loop``) takes its stream's next sequence number from the store, as before. An event of a
**recorded** input read from its start (a replay file without ``restamp``/``loop``, a camera
video file or image folder that is not watched; the inputs whose aggregates are deduplicated as
``same_readings``) gets a sequence number derived from what it is about:

    ``seq = blake2b-64(identity NUL event NUL position) >> 2``  (62 bits, so a positive int64)

with ``identity`` the input file's name (a replay's file name without its folder; a camera
frame's file relative to its folder), ``event`` ``raised``/``updated``/``cleared`` and
``position`` the window's first sample time in integer ms (replay) or the video frame index
(``0`` for an image of a folder). Replaying the file again, on this gateway or another, yields
the same ``alert_id`` for the same event: the store does not store it twice, the fleet answers
``duplicate`` and consumers deduplicate by ``alert_id`` as after any MQTT re-delivery. The ids
keep the wire form ``<device>:<stream>:<seq>``; derived numbers never advance the stream's
counter, and two different events collide with probability about n² / 2^63.
"""

from __future__ import annotations

import hashlib


def recorded_seq(identity: str, event: str, position: int) -> int:
    """The sequence number of an event of a recorded input (module docstring).

    Args:
        identity: The input file's name (see the module docstring).
        event: ``raised``, ``updated`` or ``cleared``.
        position: The window start in integer ms (replay) or the video frame index (camera).

    Returns:
        An int in ``[0, 2**62)``.

    >>> recorded_seq("skab/1.csv", "raised", 1_600_000_000_000) == recorded_seq(
    ...     "skab/1.csv", "raised", 1_600_000_000_000)
    True
    >>> recorded_seq("a.csv", "raised", 0) != recorded_seq("a.csv", "cleared", 0)
    True
    """
    text = f"{identity}\0{event}\0{int(position)}".encode("utf-8", "surrogateescape")
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2
