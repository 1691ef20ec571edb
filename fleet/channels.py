"""Fast check of schema-2 channel texts: each string one storable ``list[ChannelStatsBody]``.

A 5,000-aggregate batch carries 5,000 channels texts (:class:`cloud_sync.protocol.
AggregateColumns`). Checking them with pydantic-core (``list[Json[Channels]]``, the twin of
:mod:`fleet.checker`) builds ~20,000 dicts, ~27 ms of a fleet worker's CPU per batch; msgspec
decodes the same texts into slotted structs that are never kept in ~10 ms. This check only
gates the fast path (:func:`fleet.ingest.check_batch`): a text it refuses sends the batch down
the slow path, where pydantic (the schema's reference) decides per record. So it must accept
no text that path would refuse, and refuse any text a database cannot store as it is:

* the struct mirrors :class:`~cloud_sync.protocol.ChannelStatsBody` field by field (names,
  order, nullability, ``channel`` 1..128 characters, ``count >= 0``, ``std >= 0``, at most 1,024
  channels) with unknown fields refused (``extra="forbid"``), and msgspec is strict (no
  ``"5"`` for 5, no ``true`` for 1, no float for an int);
* storable bounds as ``fleet.checker(storable=True)``: integers within int64, floats finite
  and within +-2**63; RFC 8259 JSON only (no ``NaN``/``Infinity`` literals, no lone surrogate
  escapes, nothing after the value). ``\\u0000`` is refused on the whole body beforehand.

``tests/fleet/test_channels_check.py`` holds it to the pydantic twin on random and mutated texts.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

_INT64_MAX = 2**63 - 1
_FLOAT_BOUND = float(2**63)

Stat = Annotated[float, Meta(ge=-_FLOAT_BOUND, le=_FLOAT_BOUND)]


class ChannelStats(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """:class:`cloud_sync.protocol.ChannelStatsBody` with storable bounds (module docstring)."""

    channel: Annotated[str, Meta(min_length=1, max_length=128)]
    count: Annotated[int, Meta(ge=0, le=_INT64_MAX)]
    min: Stat | None
    max: Stat | None
    mean: Stat | None
    std: Annotated[float, Meta(ge=0, le=_FLOAT_BOUND)] | None


_DECODER = msgspec.json.Decoder(Annotated[list[ChannelStats], Meta(max_length=1024)])


def channels_ok(texts: list[str]) -> bool:
    """True when every text is one storable JSON ``list[ChannelStatsBody]`` (module docstring).

    >>> channels_ok(['[]', '[{"channel":"a","count":1,"min":null,"max":2,"mean":1.5,"std":0}]'])
    True
    >>> channels_ok(['[{"channel":"a","count":1,"min":NaN,"max":2,"mean":1.5,"std":0}]'])
    False
    """
    decode = _DECODER.decode
    try:
        for text in texts:
            decode(text)
    except (msgspec.DecodeError, TypeError):
        return False
    return True
