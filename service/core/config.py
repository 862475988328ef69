"""The service's settings, read once from the environment (prefix `FUSIONWATCH_`).

    FUSIONWATCH_DATABASE_URL=postgresql+psycopg://user@host:5432/fusionwatch fusionwatch serve
    FUSIONWATCH_LOG_LEVEL=INFO fusionwatch serve
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from optimizer.model_io import MAX_NODES

# service/core/config.py -> the checkout's root, where alembic.ini, migrations/ and var/ live.
REPO_ROOT = Path(__file__).resolve().parents[2]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


# Connections a process keeps open, and as many more it may open for a burst (closed when given
# back). SQLAlchemy's default, 5 (+10), is below the requests the API serves at once (anyio's 40
# threads; bench/load.py keeps 16 in flight): every request past the fifth closed its connection
# when done and the next one opened a new one, a PostgreSQL backend forked and set up each time.
# At 16 in flight that was one new connection per four webhooks (705 over 3,000) and p99 183 ms;
# with 20 kept, 23 connections over the run and p99 62-108 ms (bench/load.py, load average 4-8).
DEFAULT_POOL_SIZE = 20


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FUSIONWATCH_", extra="ignore")

    # SQLite needs no server, so `make run` works on a bare machine; its folder is created on first use.
    database_url: str = f"sqlite:///{REPO_ROOT / 'var' / 'fusionwatch.db'}"
    # Database connections each API process keeps open (as many again for a burst): at least the
    # requests it serves at once, and times the API processes within the server's max_connections.
    database_pool_size: int = Field(default=DEFAULT_POOL_SIZE, ge=1)
    # Quiet by default: a service that logs every request buries the one line that matters.
    log_level: LogLevel = "WARNING"
    # Uploaded model files, content-addressed: <data_dir>/models/<sha256>/<file>.
    data_dir: Path = REPO_ROOT / "var"
    # Hostile-input limits (issue: every upload is hostile until checked). An upload over
    # max_upload_mb gets 413; a model over max_nodes nodes or with a tensor declaring more than
    # max_tensor_mb gets 422 naming the limit.
    max_upload_mb: int = 1024
    max_nodes: int = MAX_NODES  # the optimizer's, which the CLI and runtime sessions use too
    max_tensor_mb: int = 4096
    # Unset: jobs run in the embedded worker process `fusionwatch serve` spawns. redis://...: jobs go to
    # Celery on that broker, one queue per machine class, for `fusionwatch worker` on any machine.
    broker_url: str | None = None
    # The machine class this process's worker measures for (and the queue it listens on).
    machine_class: str = "cpu"
    # A job running longer is killed and retried; after max_attempts it fails with its reason.
    job_timeout_s: float = 1800.0
    # Address space a worker process may take (MB); 0: three quarters of the machine's memory. A model
    # whose tensors explode at run time then fails its job with MemoryError instead of taking the
    # machine's memory (or the OOM killer) with it.
    job_memory_mb: int = 0
    max_attempts: int = 2
    # Python modules defining custom-op kernels for both engines (service/adapters/engines/custom_ops.py), comma-separated.
    custom_ops: str = ""
    # Reading (the API's GETs, the dashboard) needs an API token unless this is true; writing always
    # does (service/auth.py). `fusionwatch token create NAME` makes one.
    public_read: bool = False
    # A project's repository may be a file:// URL only where this is true (tests, a server beside its
    # repositories): on a shared server it would read any repository on the server's disk.
    allow_file_repositories: bool = False
    # Seconds a push's `git fetch` of the pushed commit may take.
    git_fetch_timeout_s: float = 300.0
    # Seconds between the embedded worker's looks at the queue when it is idle.
    poll_interval_s: float = 0.5

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


settings = Settings()
