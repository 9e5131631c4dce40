"""``/docs`` (Swagger UI) and ``/redoc`` served with their assets from earm itself, so the API
documentation works on a machine without internet access (FastAPI's own pages load them from
a CDN). The assets come from the ``fastapi-offline`` package (MIT; it ships Swagger UI, Apache
2.0, and ReDoc, MIT, with their licences); ReDoc's bundle is served with its sidebar logo, the
one thing it loads from a CDN, replaced by a blank image. The pages are plain routes, not API
routes: like the OpenAPI document, they need no key (docs/security.md)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse, Response

ASSETS_PATH = "/docs-assets"
OAUTH2_REDIRECT_PATH = "/docs/oauth2-redirect"
REDOC_BUNDLE_PATH = "/redoc/redoc.standalone.js"
#: ReDoc's sidebar always shows a logo loaded from its CDN; served bundles show a blank image.
REDOC_CDN_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
BLANK_IMAGE = "data:image/svg+xml,%3Csvg xmlns=%27http://www.w3.org/2000/svg%27/%3E"


def _offline_redoc_bundle(bundle: bytes) -> bytes:
    """The ReDoc bundle without its one request to another origin (its logo)."""
    if REDOC_CDN_LOGO.encode() not in bundle:
        # A new fastapi-offline release moved it: the browser test would see the request.
        return bundle
    return bundle.replace(REDOC_CDN_LOGO.encode(), BLANK_IMAGE.encode())


def install_offline_docs(app: FastAPI) -> None:
    """Serve /docs, /docs/oauth2-redirect, /redoc and their assets; ``app`` must have been
    created with ``docs_url=None, redoc_url=None``."""
    assets = files("fastapi_offline") / "static"
    app.mount(ASSETS_PATH, StaticFiles(directory=str(assets)), name="docs-assets")
    title = app.title
    redoc_bundle: list[bytes] = []  # read on first use (1 MB)

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{title} - Swagger UI",
            oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_PATH}",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            # Swagger UI would otherwise ask validator.swagger.io for a badge: no request
            # leaves the origin.
            swagger_ui_parameters={"validatorUrl": None},
        )

    async def oauth2_redirect(request: Request) -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{title} - ReDoc",
            redoc_js_url=f"{root}{REDOC_BUNDLE_PATH}",
            redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )

    async def redoc_script(request: Request) -> Response:
        if not redoc_bundle:
            redoc_bundle.append(
                _offline_redoc_bundle((assets / "redoc.standalone.js").read_bytes())
            )
        return Response(
            redoc_bundle[0],
            media_type="text/javascript",
            headers={"Cache-Control": "public, max-age=3600"},
        )

    app.add_route("/docs", swagger_ui, include_in_schema=False)
    app.add_route(OAUTH2_REDIRECT_PATH, oauth2_redirect, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)
    app.add_route(REDOC_BUNDLE_PATH, redoc_script, include_in_schema=False)
