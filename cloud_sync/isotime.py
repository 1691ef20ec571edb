"""ISO 8601 timestamps read as Python 3.11's ``datetime.fromisoformat`` reads them, on 3.10 too.

Python 3.11 reads most of ISO 8601 (RFC 3339 included: a ``Z`` suffix, any number of fraction
digits, ``+0000`` offsets); Python 3.10 reads only what :meth:`datetime.datetime.isoformat`
writes. Both sides of the wire (the agent's sources, the fleet's ingest) parse through
:func:`fromisoformat`, which on 3.10 first rewrites the RFC 3339 forms 3.10 lacks:

* a trailing ``Z`` becomes ``+00:00`` (a lower-case ``z`` stays an error, as in 3.11);
* a fraction of 1-5 or 7+ digits is padded or cut to 6 (microseconds; cut, as 3.11 does);
* an offset ``+hhmm`` or ``+hh`` becomes ``+hh:mm``
  (3.10 already accepts any one character between the date and the time).

Other forms 3.11 reads (week dates ``2024-W01-1``, the basic format ``20240101T000000``,
ordinal dates) stay a :class:`ValueError` on 3.10.
"""

from __future__ import annotations

import datetime as dt
import re
import sys

_TAIL = re.compile(
    r"^(?P<head>\d{4}-\d{2}-\d{2}.\d{2}:\d{2}(?::\d{2})?)"
    r"(?:[.,](?P<frac>\d+))?"
    r"(?P<tz>Z|[+-]\d{2}(?::?\d{2})?(?::?\d{2}(?:\.\d+)?)?)?$"
)


def _rewrite(text: str) -> str:
    """``text`` in the subset Python 3.10's ``fromisoformat`` reads (unchanged when it does
    not look like an RFC 3339 date-time).

    >>> _rewrite("2024-03-09T11:14:33.5Z")
    '2024-03-09T11:14:33.500000+00:00'
    >>> _rewrite("2024-03-09T11:14:33.123456789+0100")
    '2024-03-09T11:14:33.123456+01:00'
    >>> _rewrite("2024-03-09")
    '2024-03-09'
    """
    m = _TAIL.match(text)
    if m is None:
        return text
    out = m["head"]
    if m["frac"] is not None:
        out += "." + (m["frac"] + "00000")[:6]
    tz = m["tz"]
    if tz == "Z":
        out += "+00:00"
    elif tz:
        digits = tz[1:].replace(":", "")
        hh, mm, rest = digits[:2], digits[2:4] or "00", digits[4:]
        out += f"{tz[0]}{hh}:{mm}" + (f":{rest[:2]}{rest[2:]}" if rest else "")
    return out


def fromisoformat(text: str) -> dt.datetime:
    """Parse an ISO 8601 date or date-time (naive when it has no offset).

    Args:
        text: e.g. ``2024-03-09T11:14:33Z``, ``2024-03-09 11:14:33.5+01:00``, ``2024-03-09``.

    Returns:
        The :class:`datetime.datetime` Python 3.11's ``fromisoformat`` returns for it.

    Raises:
        ValueError: Not an ISO 8601 timestamp (or, on 3.10, a form outside the module
            docstring's list).

    >>> fromisoformat("2024-03-09T11:14:33Z").isoformat()
    '2024-03-09T11:14:33+00:00'
    >>> fromisoformat("2024-03-09 11:14:33.25").isoformat()
    '2024-03-09T11:14:33.250000'
    """
    if sys.version_info >= (3, 11):
        return dt.datetime.fromisoformat(text)
    return dt.datetime.fromisoformat(_rewrite(text))  # pragma: no cover - Python 3.10
