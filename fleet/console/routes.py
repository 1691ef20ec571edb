"""``GET /console/`` and its assets: the console's page, script, style sheet and icon (``GET /``
redirects to the console).

The files (``fleet/console/static``) are read once at import and served from memory. They carry
no data: the script asks the JSON API with the session cookie (:mod:`fleet.api.accounts`), so
the pages themselves need no login. Every answer has a Content-Security-Policy that allows only
the fleet's own script, style, images and API (no inline script or style, no other origin, no
framing: the W3C CSP Level 3 directives below) and ``X-Content-Type-Options: nosniff``;
the page is ``Cache-Control: no-store``.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from fleet.errors import NotFound

router = APIRouter(include_in_schema=False)
STATIC_DIR = Path(__file__).with_name("static")
#: The console's Content-Security-Policy (CSP Level 3).
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_ASSETS: dict[str, tuple[bytes, str]] = {
    p.name: (p.read_bytes(), _TYPES[p.suffix])
    for p in sorted(STATIC_DIR.iterdir()) if p.suffix in _TYPES
}


def security_headers(cache: str) -> dict[str, str]:
    """Headers of every console answer."""
    return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": cache}


@router.get("/")
def root_redirect() -> RedirectResponse:
    """The fleet's bare address (what a person types first) opens the console."""
    return RedirectResponse("/console/", status_code=307)


@router.get("/console")
def console_redirect() -> RedirectResponse:
    return RedirectResponse("/console/", status_code=308)


@router.get("/console/")
def console_page() -> Response:
    body, ctype = _ASSETS["index.html"]
    return Response(body, media_type=ctype, headers=security_headers("no-store"))


@router.get("/console/{asset}")
def console_asset(asset: str) -> Response:
    found = _ASSETS.get(asset)
    if found is None or asset == "index.html":
        raise NotFound("no such console file")
    body, ctype = found
    return Response(body, media_type=ctype, headers=security_headers("no-cache"))


@router.get("/favicon.ico")
def favicon() -> Response:
    """Browsers ask for ``/favicon.ico`` on their own: the console's SVG icon."""
    body, ctype = _ASSETS["favicon.svg"]
    return Response(body, media_type=ctype, headers=security_headers("max-age=86400"))
