"""Webhook routes (admin token; who may add webhooks decides where the fleet sends requests,
see docs/fleet-operations.md, "SSRF"):

* ``POST /v1/webhooks``: a :class:`~fleet.api.ops_models.WebhookCreate`, 201 with the webhook
  (never the secret); 422 for a bad URL, events or secret.
* ``GET /v1/webhooks``: every webhook.
* ``DELETE /v1/webhooks/{id}``: 204; its deliveries go too; 404 unknown.
* ``GET /v1/webhooks/deliveries?state=dead&limit=100``: deliveries, newest first (the
  dead-letter list with ``state=dead``).
* ``POST /v1/webhooks/deliveries/{id}/redeliver``: queue a dead or delivered delivery again
  (attempts from 0), 200 with it; 404 when it is unknown or still pending.

Adding, removing and redelivering are recorded in the audit log (``webhook.add``,
``webhook.remove``, ``webhook.redeliver``; never the secret, and of the URL only its host:
a receiver's path may be a credential, and viewers read the audit log). The console's Webhooks page
(admins only) shows the dead-letter list and redelivers.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from fleet.api.auditing import arecord, record
from fleet.api.deps import AdminDep, Services, ServicesDep
from fleet.api.json_body import ENROLL_MAX_BYTES, NO_BODY, body_doc, read_model
from fleet.api.ops_models import DeliveryList, DeliveryOut, WebhookCreate, WebhookList, WebhookOut
from fleet.db.webhooks import WebhookStore

router = APIRouter()
Id = Annotated[int, Path(ge=1, le=2**63 - 1)]


def _store(services: Services) -> WebhookStore:
    assert services.webhooks is not None
    return services.webhooks


def _changed(services: Services) -> None:
    if services.events is not None:
        services.events.changed()


@router.post("/v1/webhooks", status_code=201, response_model=WebhookOut,
             openapi_extra=body_doc(WebhookCreate), summary="Add a webhook")
async def add_webhook(request: Request, services: ServicesDep, who: AdminDep) -> WebhookOut:
    body = await read_model(request, WebhookCreate, ENROLL_MAX_BYTES)  # after the token check
    hook = await run_in_threadpool(_store(services).add, body.url, body.events, body.secret)
    _changed(services)
    # the host only: a receiver's path or query may hold a secret (Slack-style URLs), and
    # viewers read the audit log
    await arecord(request, who, "webhook.add", str(hook.id),
                  {"host": urlsplit(hook.url).hostname, "events": hook.events})
    return WebhookOut.of(hook)


@router.get("/v1/webhooks", response_model=WebhookList, summary="List webhooks")
def list_webhooks(services: ServicesDep, _admin: AdminDep) -> WebhookList:
    return WebhookList(webhooks=[WebhookOut.of(w) for w in _store(services).list()])


@router.delete("/v1/webhooks/{webhook_id}", status_code=204, summary="Remove a webhook")
def remove_webhook(webhook_id: Id, request: Request, services: ServicesDep,
                   who: AdminDep) -> Response:
    _store(services).remove(webhook_id)
    _changed(services)
    record(request, who, "webhook.remove", str(webhook_id))
    return Response(status_code=204)


@router.get("/v1/webhooks/deliveries", response_model=DeliveryList,
            summary="Webhook deliveries (the dead-letter list with state=dead)")
def list_deliveries(
    services: ServicesDep, _admin: AdminDep,
    state: Literal["pending", "delivered", "dead"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> DeliveryList:
    found = _store(services).deliveries(state, limit)
    return DeliveryList(deliveries=[DeliveryOut.of(d) for d in found])


@router.post("/v1/webhooks/deliveries/{delivery_id}/redeliver", response_model=DeliveryOut,
             summary="Send a dead or delivered delivery again", openapi_extra=NO_BODY)
def redeliver(delivery_id: Id, request: Request, services: ServicesDep,
              who: AdminDep) -> DeliveryOut:
    found = _store(services).redeliver(delivery_id)
    if services.events is not None:
        services.events.queued(1)
    record(request, who, "webhook.redeliver", str(delivery_id),
           {"webhook_id": found.webhook_id, "event": found.event})
    return DeliveryOut.of(found)
