"""What the dashboard serves to anyone: its static files and the sign-in page.

Signing in stores the API token in an HttpOnly, SameSite=Strict cookie, so the page's scripts never
see it and no other site's form can use it; signing out deletes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import plotly
from fastapi import APIRouter, Form, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from service.auth import COOKIE
from service.errors import NotFound, ServiceError
from service.usecases.tokens import authenticate
from service.web.templating import STATIC, templates

sign_in_router = APIRouter(include_in_schema=False)

STATIC_FILES = {
    "dashboard.css": (STATIC / "dashboard.css", "text/css"),
    "dashboard.js": (STATIC / "dashboard.js", "text/javascript"),
    "plotly.min.js": (Path(plotly.__file__).parent / "package_data" / "plotly.min.js", "text/javascript"),
}
COOKIE_DAYS = 30


def local_path(target: str, default: str = "/") -> str:
    """Only a path on this site: a form or a link must not be able to send the browser elsewhere."""
    return target if target.startswith("/") and not target.startswith(("//", "/\\")) else default


def error_page(request: Request, error: ServiceError) -> Response:
    return templates.TemplateResponse(request, "error.html", {"message": error.message}, status_code=error.status)


@sign_in_router.get("/static/{name}")
def read_static(name: str) -> FileResponse:
    if name not in STATIC_FILES:
        raise NotFound(f"no static file {name[:80]!r}")
    path, media_type = STATIC_FILES[name]
    return FileResponse(path, media_type=media_type, headers={"Cache-Control": "public, max-age=3600"})


@sign_in_router.get("/login", response_class=HTMLResponse)
def read_login(request: Request, next: str = "/") -> Response:
    return templates.TemplateResponse(request, "login.html", {"next": local_path(next), "error": None})


@sign_in_router.post("/login", response_class=HTMLResponse)
def sign_in(request: Request, token: Annotated[str, Form()], next: Annotated[str, Form()] = "/") -> Response:
    services = request.app.state.services
    with services.read_session_factory() as session:
        principal = authenticate(session, token.strip())
    if principal is None:
        context = {"next": local_path(next), "error": "That token is unknown, revoked or mistyped."}
        return templates.TemplateResponse(request, "login.html", context, status_code=401)
    response = RedirectResponse(local_path(next), status_code=303)
    response.set_cookie(COOKIE, token.strip(), max_age=COOKIE_DAYS * 86400, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
    return response


@sign_in_router.post("/logout")
def sign_out() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response
