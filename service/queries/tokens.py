"""Every API token with its project's name (never the token: only its first characters are stored)."""

from __future__ import annotations

from service.models import ApiToken
from service.services import Services
from service.usecases.tokens import list_tokens


def tokens(services: Services) -> list[tuple[ApiToken, str | None]]:
    with services.read_session_factory() as session:
        return list_tokens(session)
