"""Operator roles, ordered: ``viewer`` < ``operator`` < ``admin``.

* viewer: reads everything an operator sees (devices, records, models, rollouts, audit).
* operator: also enrolls/revokes/tags devices, pushes models, creates and steers rollouts,
  acknowledges alerts.
* admin: also manages users and API tokens.

>>> at_least("operator", "viewer"), at_least("viewer", "operator"), lowest("admin", "viewer")
(True, False, 'viewer')
"""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["viewer", "operator", "admin"]
#: Every role, lowest first.
ROLES: tuple[Role, ...] = get_args(Role)


def rank(role: str) -> int:
    """0 for viewer, 1 operator, 2 admin. Raises: ValueError: not a role."""
    return ROLES.index(role)


def at_least(role: str, minimum: str) -> bool:
    """Whether ``role`` may do what ``minimum`` may."""
    return rank(role) >= rank(minimum)


def lowest(a: Role, b: Role) -> Role:
    """The lesser of two roles (a token never acts above its user's current role)."""
    return a if rank(a) <= rank(b) else b


def parse_role(text: str) -> Role:
    """Raises: ValueError: not one of :data:`ROLES`."""
    for role in ROLES:
        if text == role:
            return role
    raise ValueError(f"role must be one of {', '.join(ROLES)}, not {text!r}")
