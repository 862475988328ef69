"""The service's settings, read once from the environment (prefix `FUSIONWATCH_`).

    FUSIONWATCH_DATABASE_URL=postgresql+psycopg://user@host:5432/fusionwatch fusionwatch serve
    FUSIONWATCH_LOG_LEVEL=INFO fusionwatch serve
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# service/core/config.py -> the checkout's root, where alembic.ini, migrations/ and var/ live.
REPO_ROOT = Path(__file__).resolve().parents[2]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FUSIONWATCH_", extra="ignore")

    # SQLite needs no server, so `make run` works on a bare machine; its folder is created on first use.
    database_url: str = f"sqlite:///{REPO_ROOT / 'var' / 'fusionwatch.db'}"
    # Quiet by default: a service that logs every request buries the one line that matters.
    log_level: LogLevel = "WARNING"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


settings = Settings()
