"""Settings come from FUSIONWATCH_* variables; logs are one JSON object per line, quiet by default."""

from __future__ import annotations

import json
import logging

import pytest
from pydantic import ValidationError

from service.core.config import REPO_ROOT, Settings
from service.core.logging import JsonFormatter


def test_defaults_are_sqlite_under_var_and_quiet(monkeypatch):
    monkeypatch.delenv("FUSIONWATCH_DATABASE_URL", raising=False)
    monkeypatch.delenv("FUSIONWATCH_LOG_LEVEL", raising=False)
    settings = Settings()
    assert settings.database_url == f"sqlite:///{REPO_ROOT / 'var' / 'fusionwatch.db'}"
    assert settings.log_level == "WARNING"
    assert (REPO_ROOT / "alembic.ini").is_file()


def test_environment_overrides_with_the_fusionwatch_prefix(monkeypatch):
    monkeypatch.setenv("FUSIONWATCH_DATABASE_URL", "postgresql+psycopg://u@db:5432/fw")
    monkeypatch.setenv("FUSIONWATCH_LOG_LEVEL", "info")
    monkeypatch.setenv("DATABASE_URL", "sqlite:///ignored.db")  # unprefixed names belong to others
    settings = Settings()
    assert settings.database_url == "postgresql+psycopg://u@db:5432/fw"
    assert settings.log_level == "INFO"


def test_an_unknown_log_level_is_rejected_by_name(monkeypatch):
    monkeypatch.setenv("FUSIONWATCH_LOG_LEVEL", "chatty")
    with pytest.raises(ValidationError, match="log_level"):
        Settings()


def test_log_records_are_json_with_their_extra_fields():
    record = logging.LogRecord("fusionwatch.service", logging.INFO, __file__, 1, "stored %s", ("runs",), None)
    record.model_id = 7
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "INFO"
    assert entry["logger"] == "fusionwatch.service"
    assert entry["message"] == "stored runs"
    assert entry["model_id"] == 7
    assert entry["ts"].endswith("+00:00")
