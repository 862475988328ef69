"""The services bundle: what one app, worker or CLI process runs the commands with.

Each app (service.app.create_app), each worker process and each test builds its own, so nothing in it
is shared between databases. Commands take it whole rather than its parts one by one, so a command
that later needs the store or the broker does not change every caller's signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.adapters.db import make_session_factory
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.storage import ModelStore
from service.core.config import Settings
from service.core.limits import UploadLimits, upload_limits
from service.usecases.known_projects import KnownProjects


@dataclass
class Services:
    settings: Settings
    session_factory: sessionmaker[Session]
    # Sessions that only read: on SQLite their transactions never take the write lock (service/adapters/db.py).
    read_session_factory: sessionmaker[Session]
    store: ModelStore
    upload_limits: UploadLimits
    database: str  # the database's URL, password hidden: what remembered API tokens were checked against
    known_projects: KnownProjects = field(default_factory=KnownProjects)  # the webhooks' and results' look-up
    # Where new jobs are announced (Celery's broker); None: the embedded worker finds them in the table.
    broker_url: str | None = None
    custom_ops: CustomOps = NO_CUSTOM_OPS  # the kernels a worker measures custom-domain ops with


def worker_services(
    engine: Engine, config: Settings, limits: UploadLimits | None = None, custom_ops: CustomOps = NO_CUSTOM_OPS,
    broker_url: str | None = None,
) -> Services:
    """A worker process's bundle: one session factory on `engine` for reads and writes alike."""
    factory = make_session_factory(engine)
    return Services(
        settings=config, session_factory=factory, read_session_factory=factory, store=ModelStore(config.data_dir),
        upload_limits=limits or upload_limits(config), database=engine.url.render_as_string(hide_password=True),
        broker_url=broker_url, custom_ops=custom_ops,
    )
