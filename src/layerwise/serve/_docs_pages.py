"""``/docs`` (Swagger UI) and ``/redoc`` served from this machine, never from a CDN.

FastAPI's own pages load their scripts and styles from jsdelivr; on a server without internet they
render blank, and that is where many such servers run. The assets here come from the
``fastapi-offline`` package (Swagger UI and ReDoc bundles, part of the ``serve`` extra), mounted
under :data:`ASSETS`; the pages are FastAPI's own, pointed at them, with ReDoc's Google fonts off.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from ..errors import MissingDependencyError

ASSETS = "/docs-assets"
# The pages may load only this server's files: ReDoc's bundle asks for its logo from cdn.redoc.ly,
# which the browser then never requests (a machine without internet would wait on it).
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)


def _assets_folder() -> Path:
    try:
        return Path(str(resources.files("fastapi_offline").joinpath("static")))
    except ModuleNotFoundError:
        raise MissingDependencyError(
            "the API pages (/docs, /redoc) need fastapi-offline: pip install 'layerwise[serve]'"
        ) from None


def add_docs_pages(app: FastAPI) -> None:
    """Mount the assets and add ``/docs``, its OAuth2 redirect and ``/redoc`` (the app was made
    with ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS, StaticFiles(directory=_assets_folder()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title}: API",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
        )
        page.headers["Content-Security-Policy"] = CSP
        return page

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title}: API",
            redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        page.headers["Content-Security-Policy"] = CSP
        return page
