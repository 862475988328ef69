"""An API token is made: a fresh secret for a holder, a scope and optionally one project, stored as its
SHA-256 alone (the token itself is shown once, by the caller)."""

from __future__ import annotations

from service.services import Services
from service.usecases.tokens import CreatedToken
from service.usecases.tokens import create_token as create_token_row


def create_token(services: Services, name: str, scope: str = "write", project: str | None = None) -> CreatedToken:
    with services.session_factory() as session, session.begin():
        return create_token_row(session, name, scope, project)
