"""Webhooks and their durable delivery queue (tables of :mod:`fleet.db.ops_tables`).

A delivery is one event for one webhook: its JSON body is fixed when the event is queued (the
HMAC signature is over exactly these bytes, :mod:`fleet.notify`). States: ``pending`` (due at
``next_attempt_at``), ``delivered`` (a 2xx answer), ``dead`` (the retry cap was reached; shown by
``GET /v1/webhooks/deliveries?state=dead`` and sent again by ``POST .../redeliver``).

Several worker processes share the queue: a delivery is taken by a conditional ``UPDATE`` that
sets ``lease_until`` (:meth:`WebhookStore.claim`), so one process sends it at a time; a process
that dies mid-delivery leaves the lease to expire and another takes the delivery again (at least
once: receivers dedupe on the ``X-Edge-Delivery`` id).
"""

from __future__ import annotations

import builtins
import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from sqlalchemy import Connection, Engine, delete, insert, or_, select, update

from fleet.db.ops_tables import webhook_deliveries, webhooks
from fleet.errors import NotFound, Unprocessable

Event = Literal["alert", "device_offline", "rollout_halted"]
EVENTS: tuple[Event, ...] = ("alert", "device_offline", "rollout_halted")
DeliveryState = Literal["pending", "delivered", "dead"]
#: Most webhooks the fleet keeps (each event fans out to every subscriber).
MAX_WEBHOOKS = 64


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def check_url(url: str) -> str:
    """An ``http(s)://host[:port]/path`` URL of at most 2,048 characters, no credentials.

    Raises:
        Unprocessable: Anything else.
    """
    parts = urlsplit(url)
    if (len(url) > 2048 or parts.scheme not in ("http", "https") or not parts.hostname
            or parts.username is not None or any(c.isspace() for c in url)):
        raise Unprocessable("webhook URL must be http(s)://host[:port]/path (no credentials, "
                            "at most 2048 characters)")
    return url


def check_events(events: Sequence[str]) -> list[Event]:
    """Raises: Unprocessable: empty, or an unknown event name."""
    bad = [e for e in events if e not in EVENTS]
    if bad or not events:
        raise Unprocessable(f"events must be a non-empty subset of {', '.join(EVENTS)}"
                            + (f" (unknown: {', '.join(bad[:5])})" if bad else ""))
    return [e for e in EVENTS if e in events]


@dataclass(frozen=True)
class Webhook:
    id: int
    url: str
    events: list[str]
    created_at: dt.datetime


@dataclass(frozen=True)
class Delivery:
    """One queued event for one webhook (``url`` and ``secret`` joined from the webhook)."""

    id: int
    webhook_id: int
    event: str
    body: str
    state: str
    attempts: int
    next_attempt_at: dt.datetime
    last_status: int | None
    last_error: str | None
    created_at: dt.datetime
    finished_at: dt.datetime | None
    url: str = ""
    secret: str = ""


class WebhookStore:
    """Webhooks and deliveries in the database.

    Args:
        engine: The fleet database.
        clock: Aware UTC now.
    """

    def __init__(self, engine: Engine, clock: Callable[[], dt.datetime] = _now) -> None:
        self._engine = engine
        self._clock = clock

    # --- webhooks ------------------------------------------------------------------------------

    def add(self, url: str, events: Sequence[str], secret: str) -> Webhook:
        """Subscribe ``url`` to ``events``, signing with ``secret`` (16..256 characters).

        Raises:
            Unprocessable: bad URL, events or secret, or :data:`MAX_WEBHOOKS` reached.
        """
        check_url(url)
        chosen = check_events(events)
        if not 16 <= len(secret) <= 256 or "\x00" in secret:
            raise Unprocessable("webhook secret must be 16..256 characters")
        now = self._clock()
        with self._engine.begin() as conn:
            if len(conn.execute(select(webhooks.c.id)).all()) >= MAX_WEBHOOKS:
                raise Unprocessable(f"at most {MAX_WEBHOOKS} webhooks")
            new_id = conn.execute(insert(webhooks).values(
                url=url, events=list(chosen), secret=secret, created_at=now,
            ).returning(webhooks.c.id)).scalar_one()
        return Webhook(int(new_id), url, list(chosen), now)

    def list(self) -> list[Webhook]:
        """Every webhook, by id (never the secret)."""
        with self._engine.connect() as conn:
            rows = conn.execute(select(webhooks).order_by(webhooks.c.id)).all()
        return [Webhook(int(r.id), r.url, list(r.events), r.created_at) for r in rows]

    def remove(self, webhook_id: int) -> None:
        """Delete a webhook and its deliveries. Raises: NotFound."""
        with self._engine.begin() as conn:
            if not conn.execute(delete(webhooks).where(webhooks.c.id == webhook_id)).rowcount:
                raise NotFound(f"no webhook {webhook_id}")

    # --- queue ---------------------------------------------------------------------------------

    def enqueue(self, event: Event, data: dict[str, Any], conn: Connection | None = None) -> int:
        """Queue ``event`` for every webhook subscribed to it; returns the deliveries queued.

        Args:
            event: The event name.
            data: Its JSON-serialisable payload (``data`` of the body).
            conn: Queue inside this transaction (the event's own: both commit or neither);
                a new transaction when None.
        """
        if conn is None:
            with self._engine.begin() as own:
                return self.enqueue(event, data, own)
        now = self._clock()
        hooks = [r.id for r in conn.execute(select(webhooks.c.id, webhooks.c.events))
                 if event in (r.events or [])]
        if not hooks:
            return 0
        body = json.dumps({"event": event, "created_at": now.isoformat().replace("+00:00", "Z"),
                           "data": data}, separators=(",", ":"), sort_keys=True)
        conn.execute(insert(webhook_deliveries), [{
            "webhook_id": h, "event": event, "body": body, "state": "pending", "attempts": 0,
            "next_attempt_at": now, "created_at": now,
        } for h in hooks])
        return len(hooks)

    def subscribed(self) -> set[str]:
        """The events at least one webhook wants."""
        with self._engine.connect() as conn:
            return {e for r in conn.execute(select(webhooks.c.events)) for e in (r.events or [])}

    def claim(self, limit: int, lease_s: float) -> builtins.list[Delivery]:
        """Take up to ``limit`` due pending deliveries for ``lease_s`` seconds (see module)."""
        now = self._clock()
        free = or_(webhook_deliveries.c.lease_until.is_(None),
                   webhook_deliveries.c.lease_until < now)
        query = (
            select(webhook_deliveries, webhooks.c.url, webhooks.c.secret)
            .join(webhooks, webhooks.c.id == webhook_deliveries.c.webhook_id)
            .where(webhook_deliveries.c.state == "pending",
                   webhook_deliveries.c.next_attempt_at <= now, free)
            .order_by(webhook_deliveries.c.next_attempt_at).limit(limit)
        )
        taken = []
        with self._engine.begin() as conn:
            for row in conn.execute(query).all():
                if conn.execute(
                    update(webhook_deliveries)
                    .where(webhook_deliveries.c.id == row.id,
                           webhook_deliveries.c.state == "pending", free)
                    .values(lease_until=now + dt.timedelta(seconds=lease_s))
                ).rowcount:
                    taken.append(_delivery(row))
        return taken

    def delivered(self, delivery_id: int, status: int) -> None:
        now = self._clock()
        with self._engine.begin() as conn:
            conn.execute(update(webhook_deliveries).where(webhook_deliveries.c.id == delivery_id)
                         .values(state="delivered", attempts=webhook_deliveries.c.attempts + 1,
                                 last_status=status, last_error=None, lease_until=None,
                                 finished_at=now))

    def failed(self, delivery_id: int, status: int | None, error: str,
               retry_at: dt.datetime | None) -> None:
        """Record a failed attempt: due again at ``retry_at``, or ``dead`` when None."""
        now = self._clock()
        values: dict[str, Any] = {
            "attempts": webhook_deliveries.c.attempts + 1, "last_status": status,
            "last_error": error[:512], "lease_until": None,
        }
        if retry_at is None:
            values |= {"state": "dead", "finished_at": now}
        else:
            values |= {"next_attempt_at": retry_at}
        with self._engine.begin() as conn:
            conn.execute(update(webhook_deliveries)
                         .where(webhook_deliveries.c.id == delivery_id).values(**values))

    def deliveries(
        self, state: DeliveryState | None = None, limit: int = 100
    ) -> builtins.list[Delivery]:
        """Newest first."""
        query = select(webhook_deliveries).order_by(webhook_deliveries.c.id.desc()).limit(limit)
        if state is not None:
            query = query.where(webhook_deliveries.c.state == state)
        with self._engine.connect() as conn:
            return [_delivery(r) for r in conn.execute(query).all()]

    def redeliver(self, delivery_id: int) -> Delivery:
        """Queue a dead (or delivered) delivery again, attempts from 0. Raises: NotFound."""
        now = self._clock()
        with self._engine.begin() as conn:
            if not conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.id == delivery_id,
                       webhook_deliveries.c.state != "pending")
                .values(state="pending", attempts=0, next_attempt_at=now, lease_until=None,
                        finished_at=None)
            ).rowcount:
                raise NotFound(f"no finished delivery {delivery_id}")
            row = conn.execute(select(webhook_deliveries)
                               .where(webhook_deliveries.c.id == delivery_id)).one()
        return _delivery(row)


def _delivery(row: Any) -> Delivery:
    m = row._mapping
    return Delivery(
        id=int(m["id"]), webhook_id=int(m["webhook_id"]), event=m["event"], body=m["body"],
        state=m["state"], attempts=int(m["attempts"]), next_attempt_at=m["next_attempt_at"],
        last_status=m["last_status"], last_error=m["last_error"], created_at=m["created_at"],
        finished_at=m["finished_at"], url=m.get("url", ""), secret=m.get("secret", ""),
    )
