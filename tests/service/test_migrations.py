"""migrations/ owns the schema: it upgrades and downgrades cleanly and matches service/models."""

from __future__ import annotations

import re

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import inspect

from service.adapters import migrate
from service.adapters.db import make_engine
from service.app import DatabaseNotMigrated, create_app
from service.models import Base

TABLES = {
    "project", "model_file", "model", "commit", "run", "job", "machine", "result", "result_fusion",
    "alert", "alert_delivery", "hook", "webhook_delivery", "api_token", "change_point_window", "history_point", "feed_set",
}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_creates_the_tables_and_downgrade_removes_them(database_url):
    assert _tables(database_url) == set()
    assert migrate.current_revision(database_url) is None

    migrate.upgrade(database_url)
    assert _tables(database_url) == TABLES | {"alembic_version"}
    assert migrate.current_revision(database_url) == migrate.head_revision()

    migrate.downgrade("base", database_url)
    assert _tables(database_url) == {"alembic_version"}  # Alembic keeps its (now empty) bookkeeping table
    assert migrate.current_revision(database_url) is None

    migrate.upgrade(database_url)  # and back up again: the downgrade left nothing in the way
    assert _tables(database_url) == TABLES | {"alembic_version"}


def test_upgrade_twice_is_a_no_op(migrated_database_url):
    migrate.upgrade(migrated_database_url)
    assert migrate.current_revision(migrated_database_url) == migrate.head_revision()


def test_migrations_match_the_models(migrated_database_url):
    """A model change without a migration (or the reverse) shows up here as a non-empty diff."""
    engine = make_engine(migrated_database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_the_service_refuses_to_start_on_an_unmigrated_database(database_url):
    with pytest.raises(DatabaseNotMigrated, match="run `fusionwatch db upgrade`"):
        with TestClient(create_app(database_url)):
            pass


def test_check_constraints_hold_the_vocabularies_the_code_uses(migrated_database_url):
    """Alembic's compare ignores CHECK text: a level or state list frozen in a migration could drift
    from service/domain/vocabulary.py (and optimizer.LEVEL_NAMES) silently, so compare them here."""
    from service.domain import vocabulary

    expected = {
        ("job", "state_known"): vocabulary.JOB_STATES,
        ("job", "engine_known"): vocabulary.ENGINES,
        ("job", "level_known"): vocabulary.LEVEL_NAMES,
        ("result", "engine_known"): vocabulary.ENGINES,
        ("result", "level_known"): vocabulary.LEVEL_NAMES,
        ("run", "state_known"): vocabulary.RUN_STATES,
        ("alert", "kind_known"): vocabulary.ALERT_KINDS,
        ("alert", "state_known"): vocabulary.ALERT_STATES,
        ("hook", "format_known"): vocabulary.HOOK_FORMATS,
        ("api_token", "scope_known"): vocabulary.TOKEN_SCOPES,
    }
    engine = make_engine(migrated_database_url)
    try:
        with engine.connect() as connection:
            inspector = inspect(connection)
            for (table, name), values in expected.items():
                checks = {c["name"]: c["sqltext"] for c in inspector.get_check_constraints(table)}
                text = checks[f"ck_{table}_{name}"]
                quoted = re.findall(r"'([^']*)'", text)
                assert quoted == list(values), (table, name, text)
    finally:
        engine.dispose()
