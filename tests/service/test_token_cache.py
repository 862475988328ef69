"""Tokens authenticated moments ago are remembered (service/usecases/tokens.py: KnownTokens): a
request costs no token query then, a revocation in this process counts at once, and one made by
another process within PRINCIPAL_TTL_S."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from service.app import create_app
from service.models import ApiToken
from service.usecases import tokens
from tests.service.db_fixtures import make_token


@pytest.fixture
def app_client(migrated_database_url, service_settings):
    with TestClient(create_app(migrated_database_url, service_settings)) as test_client:
        yield test_client


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(tokens.known_tokens, "clock", fake)
    return fake


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_remembered_token_is_not_looked_up_again(app_client, migrated_database_url, monkeypatch, clock):
    token = make_token(migrated_database_url, "ci")
    lookups = []
    real = tokens.authenticate
    monkeypatch.setattr(tokens, "authenticate", lambda session, presented: lookups.append(presented) or real(session, presented))
    for _ in range(3):
        assert app_client.get("/api/v1/projects", headers=_bearer(token)).status_code == 200
    assert app_client.post("/api/v1/projects", json={"name": "bert"}, headers=_bearer(token)).status_code == 201
    assert lookups == [token]
    clock.now += tokens.PRINCIPAL_TTL_S + 0.1
    assert app_client.get("/api/v1/projects", headers=_bearer(token)).status_code == 200
    assert lookups == [token, token]


def test_a_revocation_by_another_process_counts_within_the_ttl(app_client, migrated_database_url, session, clock):
    token = make_token(migrated_database_url, "ci")
    assert app_client.get("/api/v1/projects", headers=_bearer(token)).status_code == 200
    # What `fusionwatch token revoke` does from its own process: only the row changes, not this cache.
    session.execute(update(ApiToken).where(ApiToken.name == "ci").values(revoked_at=datetime.now(UTC)))
    session.commit()
    clock.now += tokens.PRINCIPAL_TTL_S - 0.5
    assert app_client.get("/api/v1/projects", headers=_bearer(token)).status_code == 200
    clock.now += 0.6
    refused = app_client.get("/api/v1/projects", headers=_bearer(token))
    assert refused.status_code == 401
    assert "unknown, revoked or malformed" in refused.json()["detail"]


def test_a_revocation_in_this_process_counts_at_once(app_client, migrated_database_url, session, clock):
    token = make_token(migrated_database_url, "ci")
    assert app_client.get("/api/v1/projects", headers=_bearer(token)).status_code == 200
    tokens.revoke_token(session, "ci")
    session.commit()
    assert app_client.get("/api/v1/projects", headers=_bearer(token)).status_code == 401


def test_tokens_are_remembered_per_database(tmp_path, service_settings, clock):
    """The same token string on two databases (copies of one) is checked against each."""
    from service.adapters import migrate

    first, second = (f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db"))
    for url in (first, second):
        migrate.upgrade(url)
    token = make_token(first, "ci")
    with TestClient(create_app(first, service_settings)) as one, TestClient(create_app(second, service_settings)) as two:
        assert one.get("/api/v1/projects", headers=_bearer(token)).status_code == 200
        assert two.get("/api/v1/projects", headers=_bearer(token)).status_code == 401


def test_use_is_still_noted_once_a_minute(app_client, migrated_database_url, session, clock):
    token = make_token(migrated_database_url, "ci")
    assert app_client.get("/api/v1/projects", headers=_bearer(token)).status_code == 200
    first = session.scalar(ApiToken.__table__.select().with_only_columns(ApiToken.last_used_at))
    assert first is not None
    session.commit()
    assert app_client.get("/api/v1/projects", headers=_bearer(token)).status_code == 200
    assert session.scalar(ApiToken.__table__.select().with_only_columns(ApiToken.last_used_at)) == first
