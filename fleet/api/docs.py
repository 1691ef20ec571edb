"""``GET /docs``: the OpenAPI page (Swagger UI) over ``/openapi.json``, every asset served by
the fleet itself (no CDN: plant networks have no internet). The Swagger UI files come from the
``swagger-ui-bundle`` package; only the three files the page loads are served. No token is
needed to read the API description (it holds no data).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from fleet.errors import NotFound

router = APIRouter(include_in_schema=False)
_ASSETS = {
    "swagger-ui-bundle.js": "application/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}


def _asset_dir() -> Path:
    import swagger_ui_bundle  # noqa: PLC0415 (only when the page is asked for)

    return Path(swagger_ui_bundle.swagger_ui_path)


@router.get("/docs")
def docs_page() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json", title="edge-fleet API",
        swagger_js_url="/docs/assets/swagger-ui-bundle.js",
        swagger_css_url="/docs/assets/swagger-ui.css",
        swagger_favicon_url="/docs/assets/favicon-32x32.png",
    )


@router.get("/docs/assets/{name}")
def docs_asset(name: str) -> Response:
    media = _ASSETS.get(name)
    if media is None:
        raise NotFound(f"no asset {name[:64]!r}")
    data = (_asset_dir() / name).read_bytes()
    return Response(data, media_type=media, headers={"Cache-Control": "max-age=86400"})
