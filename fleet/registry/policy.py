"""Pure rollout rules: canary choice, state machine, halt rule. No I/O.

States (``rollouts.state``)::

    canary ──promote──► promoted         canary: only the canary devices are assigned
      │  ▲                 │             promoted: every device of the target is assigned
    pause│resume         pause           paused: nobody gets an assignment (resume returns to the
      ▼  │                 ▼                     state it was paused in)
    paused ◄───────────────┘             halted: set by the fleet when failures reach the
                                                 threshold; nobody is assigned; ``resume`` is the
    canary|promoted ──(failures)──► halted       operator's override (back to canary)
    any but aborted ──abort──► aborted   aborted: terminal; devices not yet active on it stop;
                                                  active ones fall back (rollback key)

A rollout whose devices all follow a newer rollout of the same stream (or of every stream) is
superseded (``superseded_by``, :mod:`fleet.registry.rollouts`): no action applies to it any more
(it would change what no device runs), whatever its state.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Literal

from fleet.errors import Conflict

RolloutState = Literal["canary", "paused", "promoted", "halted", "aborted"]
Action = Literal["promote", "pause", "resume", "abort"]
#: States in which assigned devices get the rollout's version.
ASSIGNING: frozenset[str] = frozenset({"canary", "promoted"})
#: Every operator action, in the order the console shows them.
ACTIONS: tuple[Action, ...] = ("promote", "pause", "resume", "abort")
#: Device report states that count as a failure of the rollout.
FAILED: frozenset[str] = frozenset({"rejected", "rolled_back"})
#: Device report states after which the device may be running the new version.
MAY_RUN: frozenset[str] = frozenset({"accepted", "shadow", "active"})


def canary_rank(device_id: str) -> str:
    """Stable rank of a device for canary choice: sha256 hex of its id.

    The same devices come first in every rollout (a stable canary ring), independent of order.
    """
    return hashlib.sha256(device_id.encode("utf-8")).hexdigest()


def pick_canaries(device_ids: Iterable[str], percent: float | None) -> set[str]:
    """The canary devices: the ``ceil(n * percent / 100)`` (at least 1) lowest-ranked ones.

    >>> pick_canaries(["a", "b", "c", "d"], 25) == pick_canaries(["d", "c", "b", "a"], 25)
    True
    >>> len(pick_canaries(["a", "b", "c"], 1)), len(pick_canaries(["a", "b"], None))
    (1, 2)

    Args:
        device_ids: The target devices.
        percent: 0 < percent <= 100, or None for every device.
    """
    ids = sorted(set(device_ids), key=canary_rank)
    if percent is None or percent >= 100:
        return set(ids)
    n = max(1, math.ceil(len(ids) * percent / 100))
    return set(ids[:n])


def transition(
    state: str, resume_state: str | None, action: Action
) -> tuple[RolloutState, RolloutState | None]:
    """The next ``(state, resume_state)`` for an operator action.

    Raises:
        Conflict: the action is not allowed in ``state``.
    """
    if action == "abort" and state != "aborted":
        return "aborted", None
    if action == "promote" and state in ("canary", "paused"):
        return "promoted", None
    if action == "pause" and state in ("canary", "promoted"):
        return "paused", "canary" if state == "canary" else "promoted"
    if action == "resume" and state == "paused":
        return ("promoted" if resume_state == "promoted" else "canary"), None
    if action == "resume" and state == "halted":
        return "canary", None
    raise Conflict(f"cannot {action} a rollout that is {state}")


def allowed_actions(state: str, resume_state: str | None, superseded: bool = False) -> list[Action]:
    """The operator actions :func:`transition` accepts now, in :data:`ACTIONS` order; none for
    a superseded rollout.

    >>> allowed_actions("canary", None), allowed_actions("halted", None)
    (['promote', 'pause', 'abort'], ['resume', 'abort'])
    >>> allowed_actions("aborted", None), allowed_actions("canary", None, superseded=True)
    ([], [])
    """
    if superseded:
        return []
    found: list[Action] = []
    for action in ACTIONS:
        try:
            transition(state, resume_state, action)
        except Conflict:
            continue
        found.append(action)
    return found


def should_halt(failures: int, halt_after_failures: int) -> bool:
    """True when ``failures`` failed devices reach the threshold (≥ 1)."""
    return failures >= max(1, halt_after_failures)
