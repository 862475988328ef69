"""What the CLI's commands share: the error console, and the checks a command runs against the
configured database before it starts (migrated, custom ops importable) with their one-line errors."""

from __future__ import annotations

import typer
from rich.console import Console

# soft_wrap: an error naming a long path stays on one line, whole, so it can be grepped and copied.
err = Console(stderr=True, soft_wrap=True)


def require_migrated() -> None:
    """Exit 2 with the advice unless the configured database is at the newest migration."""
    from service.core.config import settings
    from service.queries.migration_state import migration_state

    state = guarded(migration_state)
    if not state.ready:
        err.print(
            f"[red]error:[/red] database {shown_url(settings.database_url)} is at migration {state.current or 'none'}, "
            f"this fusionwatch needs {state.head}; run `fusionwatch db upgrade`",
        )
        raise typer.Exit(2)


def require_custom_ops() -> None:
    """Exit 2 naming the module unless FUSIONWATCH_CUSTOM_OPS imports: a worker started without it
    would fail every job (or, embedded, be restarted forever)."""
    from service.adapters.engines.custom_ops import load_custom_ops
    from service.core.config import settings

    try:
        load_custom_ops(settings.custom_ops)
    except ValueError as error:
        err.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2) from error


def guarded(database_step):
    """Run a step against the database; a bad URL, an unreachable server or an unknown revision
    becomes one error line and exit status 2, like the optimizer's bad inputs."""
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return database_step()
    except (CommandError, SQLAlchemyError, FileNotFoundError, ValueError) as error:
        err.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2) from error


def shown_url(database_url: str) -> str:
    from service.adapters.db import without_password

    return without_password(database_url)
