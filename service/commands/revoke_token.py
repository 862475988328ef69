"""An API token is revoked: it stops working at once, and its row stays, for the record."""

from __future__ import annotations

from service.models import ApiToken
from service.services import Services
from service.usecases.tokens import revoke_token as revoke_token_row


def revoke_token(services: Services, name: str) -> ApiToken:
    with services.session_factory() as session, session.begin():
        return revoke_token_row(session, name)
