"""``edge-fleet device list``: the devices as a text table, with enrolment and connection.

* ENROLMENT: ``revoked`` (token revoked), ``pending`` (enrolled, the token not used yet: no
  contact since the enrolment; a re-enrolled device's earlier contacts do not count),
  ``enrolled`` (the device has used its token).
* CONNECTION: ``never`` (no contact yet), ``online`` (last contact, a health report or an
  upload, within ``offline_after_s``), ``offline`` (silent longer).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Literal

from fleet.db.devices import Device

Enrolment = Literal["enrolled", "pending", "revoked"]
Connection = Literal["online", "offline", "never"]
HEADER = ("DEVICE", "ENROLMENT", "CONNECTION", "LAST SEEN (UTC)", "AGENT", "MODEL",
          "BACKLOG AL/AG", "TAGS")


def enrolment(device: Device) -> Enrolment:
    """``revoked``, ``pending`` (no contact since it was enrolled, or re-enrolled: ``created_at``
    is the latest enrolment) or ``enrolled``."""
    if device.revoked_at is not None:
        return "revoked"
    if device.last_seen is None or device.last_seen < device.created_at:
        return "pending"
    return "enrolled"


def connection(last_seen: dt.datetime | None, now: dt.datetime,
               offline_after_s: float) -> Connection:
    """``never``, ``online`` or ``offline`` from the last contact (aware UTC; pure).

    >>> t = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    >>> [connection(None, t, 300), connection(t, t + dt.timedelta(seconds=300), 300),
    ...  connection(t, t + dt.timedelta(seconds=301), 300)]
    ['never', 'online', 'offline']
    """
    if last_seen is None:
        return "never"
    return "offline" if (now - last_seen).total_seconds() > offline_after_s else "online"


def format_table(devices: Sequence[Device], now: dt.datetime, offline_after_s: float) -> str:
    """Devices as a fixed-width text table (one header line, one line per device).

    Args:
        devices: The devices, in the order to show.
        now: Aware UTC now.
        offline_after_s: Silence (seconds) after which a device is ``offline``.
    """
    rows = [HEADER]
    for d in devices:
        rows.append((
            d.device_id,
            enrolment(d),
            connection(d.last_seen, now, offline_after_s),
            d.last_seen.strftime("%Y-%m-%d %H:%M:%S") if d.last_seen else "never",
            d.agent_version or "-",
            f"{d.model_name}@{d.model_version}" if d.model_name else "-",
            f"{_n(d.backlog_alerts)}/{_n(d.backlog_aggregates)}",
            ",".join(d.tags) or "-",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)
