"""Account routes: console login/logout, users, personal API tokens, the audit log.

* ``POST /v1/session`` (no credentials): ``{"username", "password"}`` as JSON, or the same
  fields form-encoded (``application/x-www-form-urlencoded``: answered with 303 to
  ``/console/``), at most 16 KiB. 200 ``SessionOut``, sets the session cookie (HttpOnly,
  SameSite=Strict, path /, ``Secure`` and ``__Host-`` prefixed over TLS, max-age = the session
  lifetime) and the CSRF cookie (readable by the console's script). 401 wrong user or password,
  429 with ``Retry-After`` during the login backoff (:mod:`fleet.accounts.sessions`). A
  cross-site form (``Sec-Fetch-Site: cross-site``) is refused (403, login CSRF).
* ``GET /v1/session`` (any operator): who am I (role, CSRF token when by session).
* ``DELETE /v1/session`` (session): log out, 204, cookies cleared.
* ``GET|POST /v1/users``, ``PATCH /v1/users/{username}`` (admin): list, create, change role,
  password or disabled. ``GET|POST /v1/tokens``, ``DELETE /v1/tokens/{id}`` (admin): personal
  API tokens (the token is in the POST answer only).
* ``GET /v1/audit`` (viewer): newest first, ``limit`` (1..1000), ``before`` (an entry id),
  ``actor``, ``action`` (a prefix: ``rollout`` matches every ``rollout.*`` action).

Every change and every login (and failed login) is recorded in the audit log.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from cloud_sync.protocol import NAME_PATTERN, PLAIN_PATTERN
from fleet.accounts.roles import Role
from fleet.accounts.service import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    Accounts,
    cookie_name,
    get_accounts,
)
from fleet.accounts.users import TokenInfo, User
from fleet.api.auditing import arecord, client_address, record
from fleet.api.deps import AdminDep, PrincipalDep, ViewerDep
from fleet.api.json_body import body_doc, validate
from fleet.errors import BadRequest, Forbidden, PayloadTooLarge, Unauthorized

router = APIRouter()
LOGIN_MAX_BYTES = 16 * 1024
_FORM = "application/x-www-form-urlencoded"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoginRequest(_Body):
    """``POST /v1/session``."""

    username: str = Field(min_length=1, max_length=64, description="The account's name.")
    password: str = Field(min_length=1, max_length=1024, description="The account's password.")


class SessionOut(_Body):
    username: str
    role: Role
    via: str = Field(description="session, token or bootstrap.")
    csrf_token: str | None = Field(None, description="Send back as X-CSRF-Token (sessions).")
    expires_at: dt.datetime | None = None


class UserCreate(_Body):
    """``POST /v1/users``: ``password`` None makes a token-only account."""

    username: str = Field(pattern=NAME_PATTERN, description="New account name.")
    role: Role = Field(description="viewer, operator or admin.")
    password: str | None = Field(None, min_length=1, max_length=1024,
                                 description="Its password (argon2-hashed); None: token-only.")


class UserChange(_Body):
    """``PATCH /v1/users/{username}``: only the fields given change."""

    role: Role | None = Field(None, description="New role; None: unchanged.")
    password: str | None = Field(None, min_length=1, max_length=1024,
                                 description="New password; None: unchanged.")
    disabled: bool | None = Field(
        None, description="True disables the account (its sessions and tokens stop working); "
                          "False enables it; None: unchanged.")


class UserOut(_Body):
    username: str
    role: Role
    created_at: dt.datetime
    disabled_at: dt.datetime | None
    has_password: bool


class TokenCreate(_Body):
    """``POST /v1/tokens``: a token acting for ``username`` with at most ``role``."""

    username: str = Field(pattern=NAME_PATTERN, description="The user the token acts for.")
    role: Role = Field(description="The token's role (at most the user's, checked per request).")
    label: str = Field("", max_length=64, description="A name to tell tokens apart.")


class TokenOut(_Body):
    id: int
    username: str
    role: Role
    label: str
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    revoked_at: dt.datetime | None
    token: str | None = Field(None, description="Only in the POST answer: shown once.")


class AuditEntry(_Body):
    id: int
    at: dt.datetime
    actor: str
    via: str
    action: str
    target: str | None
    address: str | None
    detail: dict[str, Any]


class AuditPage(_Body):
    entries: list[AuditEntry]


def _user_out(user: User) -> UserOut:
    return UserOut(username=user.username, role=user.role, created_at=user.created_at,
                   disabled_at=user.disabled_at, has_password=user.has_password)


def _token_out(info: TokenInfo, token: str | None = None) -> TokenOut:
    return TokenOut(id=info.id, username=info.username, role=info.role, label=info.label,
                    created_at=info.created_at, last_used_at=info.last_used_at,
                    revoked_at=info.revoked_at, token=token)


async def _read_limited(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > LOGIN_MAX_BYTES:
        raise PayloadTooLarge(f"login body over {LOGIN_MAX_BYTES} bytes")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > LOGIN_MAX_BYTES:
            raise PayloadTooLarge(f"login body over {LOGIN_MAX_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def _login_body(request: Request) -> tuple[LoginRequest, bool]:
    """The login fields and whether they came as a form."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw = await _read_limited(request)
    if ctype != _FORM:
        return validate(LoginRequest, raw), False
    if request.headers.get("sec-fetch-site") == "cross-site":
        raise Forbidden("cross-site login form refused")
    try:
        fields = urllib.parse.parse_qs(raw.decode("utf-8"), strict_parsing=False,
                                       max_num_fields=8)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("login form is not UTF-8 form encoding") from None
    doc = {k: v[0] for k, v in fields.items() if k in ("username", "password")}
    return LoginRequest.model_validate(doc), True


def _login(accounts: Accounts, body: LoginRequest, address: str) -> tuple[str, SessionOut]:
    accounts.throttle.check(body.username, address)
    user = accounts.users.verify_password(body.username, body.password)
    if user is None:
        accounts.throttle.failed(body.username, address)
        accounts.audit.record(body.username, "session", "session.login_failed", body.username,
                              address)
        raise Unauthorized("wrong username or password")
    accounts.throttle.succeeded(body.username, address)
    value, info = accounts.sessions.create(user.username, address)
    accounts.audit.record(user.username, "session", "session.login", user.username, address)
    return value, SessionOut(username=info.username, role=info.role, via="session",
                             csrf_token=info.csrf_token, expires_at=info.expires_at)


@router.post("/v1/session", response_model=SessionOut, openapi_extra=body_doc(LoginRequest))
async def login(request: Request) -> Response:
    body, form = await _login_body(request)
    accounts = get_accounts(request)
    address = client_address(request) or "unknown"
    value, out = await run_in_threadpool(_login, accounts, body, address)
    secure = request.url.scheme == "https"
    resp: Response = (RedirectResponse("/console/", status_code=303) if form
                      else JSONResponse(out.model_dump(mode="json")))
    ttl = int(request.app.state.services.settings.session_ttl_s)
    resp.set_cookie(cookie_name(SESSION_COOKIE, secure), value, max_age=ttl, path="/",
                    httponly=True, samesite="strict", secure=secure)
    resp.set_cookie(cookie_name(CSRF_COOKIE, secure), out.csrf_token or "", max_age=ttl,
                    path="/", httponly=False, samesite="strict", secure=secure)
    return resp


@router.get("/v1/session", response_model=SessionOut)
def whoami(request: Request, who: ViewerDep) -> SessionOut:
    assert who.role is not None and who.username is not None
    csrf = None
    expires = None
    if who.via == "session":
        secure = request.url.scheme == "https"
        info = get_accounts(request).sessions.lookup(
            request.cookies.get(cookie_name(SESSION_COOKIE, secure), ""))
        if info is not None:
            csrf, expires = info.csrf_token, info.expires_at
    return SessionOut(username=who.username, role=who.role, via=who.via, csrf_token=csrf,
                      expires_at=expires)


@router.delete("/v1/session", status_code=204)
def logout(request: Request, who: PrincipalDep) -> Response:
    if who.via != "session":
        raise Forbidden("only a console session logs out (revoke a token instead)")
    secure = request.url.scheme == "https"
    get_accounts(request).sessions.delete(
        request.cookies.get(cookie_name(SESSION_COOKIE, secure), ""))
    record(request, who, "session.logout", who.username)
    resp = Response(status_code=204)
    for base in (SESSION_COOKIE, CSRF_COOKIE):
        resp.delete_cookie(cookie_name(base, secure), path="/", secure=secure,
                           httponly=base == SESSION_COOKIE, samesite="strict")
    return resp


Username = Annotated[str, Path(pattern=NAME_PATTERN)]


@router.get("/v1/users", response_model=list[UserOut])
def list_users(request: Request, _admin: AdminDep) -> list[UserOut]:
    return [_user_out(u) for u in get_accounts(request).users.list_users()]


@router.post("/v1/users", status_code=201, response_model=UserOut,
             openapi_extra=body_doc(UserCreate))
async def create_user(request: Request, who: AdminDep) -> UserOut:
    body = validate(UserCreate, await _read_limited(request))
    user = await run_in_threadpool(get_accounts(request).users.add, body.username, body.role,
                                   body.password)
    await arecord(request, who, "user.create", body.username, {"role": body.role})
    return _user_out(user)


@router.patch("/v1/users/{username}", response_model=UserOut,
              openapi_extra=body_doc(UserChange))
async def change_user(username: Username, request: Request, who: AdminDep) -> UserOut:
    body = validate(UserChange, await _read_limited(request))
    accounts = get_accounts(request)
    user = await run_in_threadpool(_change_user, accounts, username, body)
    detail = body.model_dump(exclude_none=True, exclude={"password"})
    if body.password is not None:
        detail["password"] = "changed"  # noqa: S105 (what the audit log says)
    await arecord(request, who, "user.change", username, detail)
    return _user_out(user)


def _change_user(accounts: Accounts, username: str, body: UserChange) -> User:
    user = accounts.users.update(username, role=body.role, password=body.password,
                                 disabled=body.disabled)
    if body.password is not None or body.disabled or body.role is not None:
        accounts.sessions.delete_user(username)  # log in again with the new state
    return user


@router.get("/v1/tokens", response_model=list[TokenOut])
def list_tokens(
    request: Request, _admin: AdminDep,
    username: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
) -> list[TokenOut]:
    return [_token_out(t) for t in get_accounts(request).users.list_tokens(username)]


@router.post("/v1/tokens", status_code=201, response_model=TokenOut,
             openapi_extra=body_doc(TokenCreate))
async def create_token(request: Request, who: AdminDep) -> TokenOut:
    body = validate(TokenCreate, await _read_limited(request))
    users = get_accounts(request).users
    token_id, token = await run_in_threadpool(users.create_token, body.username, body.role,
                                              body.label)
    await arecord(request, who, "token.create", body.username,
                  {"id": token_id, "role": body.role, "label": body.label})
    info = next(t for t in users.list_tokens(body.username) if t.id == token_id)
    return _token_out(info, token)


@router.delete("/v1/tokens/{token_id}", status_code=204)
def revoke_token(
    token_id: Annotated[int, Path(ge=1, le=2**63 - 1)], request: Request, who: AdminDep
) -> Response:
    owner = get_accounts(request).users.revoke_token(token_id)
    record(request, who, "token.revoke", owner, {"id": token_id})
    return Response(status_code=204)


@router.get("/v1/audit", response_model=AuditPage)
def audit(
    request: Request, _viewer: ViewerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    actor: Annotated[str | None, Query(max_length=64, pattern=PLAIN_PATTERN)] = None,
    action: Annotated[str | None, Query(max_length=64, pattern=PLAIN_PATTERN)] = None,
) -> AuditPage:
    rows = get_accounts(request).audit.list(limit=limit, before_id=before, actor=actor,
                                            action=action)
    return AuditPage(entries=[AuditEntry(**r) for r in rows])

