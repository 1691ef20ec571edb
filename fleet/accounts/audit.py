"""The audit log: one row per operator action.

What is recorded: every change an operator makes through the API (enroll, revoke, tag a device;
push a model; create, promote, pause, resume, abort a rollout; acknowledge an alert; users and
tokens; login, failed login, logout), with who (``actor``: a username, ``bootstrap`` for the
bootstrap admin token), how (``via``: session, token, bootstrap), the ``action``
(``<noun>.<verb>``), its ``target`` (device id, ``name@version``, rollout id, ...), the client
address (the TCP peer, or ``X-Forwarded-For`` from a proxy uvicorn trusts:
``--forwarded-allow-ips``), the time (aware UTC) and a small JSON ``detail``.
Reads are not recorded.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, insert, or_, select

from fleet.db.account_tables import audit_log
from fleet.db.devices import utcnow


class AuditLog:
    """Append and read the audit log.

    Args:
        engine: The fleet database.
        clock: Aware UTC now.
    """

    def __init__(self, engine: Engine, clock: Callable[[], dt.datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def record(
        self, actor: str, via: str, action: str, target: str | None = None,
        address: str | None = None, detail: dict[str, Any] | None = None,
    ) -> None:
        """Append one entry (strings cut to their column sizes)."""
        with self._engine.begin() as conn:
            conn.execute(insert(audit_log).values(
                at=self._clock(), actor=actor[:64], via=via[:16], action=action[:64],
                target=None if target is None else target[:200],
                address=None if address is None else address[:64], detail=detail or {},
            ))

    def list(
        self, *, limit: int = 100, before_id: int | None = None, actor: str | None = None,
        action: str | None = None,
    ) -> list[dict[str, Any]]:
        """Entries newest first (``before_id``: older than that entry, to page back).

        ``action`` matches that action and every action under it as a prefix: ``rollout`` (or
        ``rollout.``) matches ``rollout.create``, ``rollout.abort``, ...; ``rollout.abort`` matches
        itself.
        """
        query = select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
        if before_id is not None:
            query = query.where(audit_log.c.id < before_id)
        if actor is not None:
            query = query.where(audit_log.c.actor == actor)
        prefix = (action or "").rstrip(".")
        if prefix:  # '' (and '.'): every action, as when not given
            query = query.where(or_(audit_log.c.action == prefix,
                                    audit_log.c.action.startswith(prefix + ".", autoescape=True)))
        with self._engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]
