"""Who may do what: API tokens on every route but health, the webhooks and the sign-in page.

A request shows its token as `Authorization: Bearer fw_...` (the CLI, CI, scripts) or in the
dashboard's sign-in cookie. Reading (GET) needs a token of any scope unless the server is started
with FUSIONWATCH_PUBLIC_READ=true; anything that changes data — uploads, results, projects, hooks,
acknowledging an alert — needs a `write` token, and a token limited to a project writes to that
project only. The webhooks authenticate themselves: the project's HMAC secret when it has one,
else a write token (service/api/routes/webhooks.py).

Rules hang on the routers (`app.include_router(..., dependencies=API_ACCESS)`), by method, so a
new route is protected the day it is written; tests/service/test_auth.py walks every route.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool

from service.errors import Forbidden, ServiceError, Unauthorized
from service.models import Project
from service.usecases.tokens import (
    Principal,
    authenticate_remembered,
    note_use,
    noted_use,
    remembered_principal,
    use_is_stale,
)

COOKIE = "fusionwatch_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HOW_TO_GET_ONE = "create one with `fusionwatch token create NAME` on the server"


class LoginRequired(ServiceError):
    """A dashboard page asked for without a token: the app answers with the sign-in page."""

    status = 401

    def __init__(self, next_url: str) -> None:
        super().__init__("sign in with an API token to see this page")
        self.next_url = next_url


def principal_of(request: Request) -> Principal | None:
    """The request's token holder; None when it shows no token; 401 when the token it shows is bad.
    Asks the database (call it in a worker thread) unless the token was authenticated moments ago."""
    if hasattr(request.state, "principal"):
        return request.state.principal
    token, from_cookie = _presented_token(request)
    principal = None
    if token is not None:
        services = request.app.state.services
        with services.read_session_factory() as session:
            principal = authenticate_remembered(session, services.database, token)
        if principal is not None and use_is_stale(principal):
            with services.session_factory() as session, session.begin():
                note_use(session, principal)
            principal = noted_use(services.database, token, principal)
        if principal is None:
            raise Unauthorized(f"the API token is unknown, revoked or malformed; {HOW_TO_GET_ONE}")
        if from_cookie and request.method not in SAFE_METHODS:
            _refuse_cross_site(request)
    request.state.principal = principal
    return principal


async def resolve_principal(request: Request) -> Principal | None:
    """`principal_of` from the event loop: a token authenticated moments ago costs a hash, not a
    thread hop and a query (service/usecases/tokens.py: KnownTokens says how long revocation takes)."""
    if not hasattr(request.state, "principal"):
        token, from_cookie = _presented_token(request)
        remembered = remembered_principal(request.app.state.services.database, token) if token else None
        if remembered is None or use_is_stale(remembered):
            return await run_in_threadpool(principal_of, request)
        if from_cookie and request.method not in SAFE_METHODS:
            _refuse_cross_site(request)
        request.state.principal = remembered
    return request.state.principal


def _presented_token(request: Request) -> tuple[str | None, bool]:
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        return value.strip(), False
    cookie = request.cookies.get(COOKIE)
    return (cookie, True) if cookie else (None, False)


def _refuse_cross_site(request: Request) -> None:
    # The cookie is SameSite=Strict already; browsers that say where a request came from are checked too.
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise Forbidden(f"a {site} request may not use the dashboard's sign-in cookie")


def require_read(request: Request) -> Principal | None:
    principal = principal_of(request)
    if principal is None and not request.app.state.services.settings.public_read:
        raise Unauthorized(f"this server needs an API token to read: send 'Authorization: Bearer <token>'; {HOW_TO_GET_ONE}")
    return principal


def require_write(request: Request) -> Principal:
    principal = principal_of(request)
    if principal is None:
        raise Unauthorized(f"this needs an API token with write scope: send 'Authorization: Bearer <token>'; {HOW_TO_GET_ONE}")
    if not principal.can_write:
        raise Forbidden(f"token {principal.name!r} is read-only; this needs a token with write scope")
    return principal


async def api_access(request: Request) -> None:
    """The API's rule: reading needs `require_read`, anything else `require_write`."""
    await resolve_principal(request)
    if request.method in SAFE_METHODS:
        require_read(request)
    else:
        require_write(request)


async def page_access(request: Request) -> None:
    """The dashboard's rule: as the API's, but a page asked for without any token goes to sign-in."""
    if request.method in SAFE_METHODS and _presented_token(request)[0] is None \
            and not request.app.state.services.settings.public_read:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target)
    await api_access(request)


def may_write_to(request: Request, project: Project) -> None:
    """403 when the request's token is limited to another project (call after api_access)."""
    principal = require_write(request)
    if principal.project_id is not None and principal.project_id != project.id:
        raise Forbidden(
            f"token {principal.name!r} may write to project {principal.project_name!r} only, not {project.name!r}"
        )


def may_create_projects(request: Request) -> None:
    principal = require_write(request)
    if principal.project_id is not None:
        raise Forbidden(f"token {principal.name!r} is limited to project {principal.project_name!r}; "
                        "creating projects needs a token with no project")


def login_url(next_url: str) -> str:
    return f"/login?next={quote(next_url, safe='/')}"


API_ACCESS = [Depends(api_access)]
PAGE_ACCESS = [Depends(page_access)]
