"""`fusionwatch token create|list|revoke`: API tokens, managed on the server's own database.

Whoever can reach the database (FUSIONWATCH_DATABASE_URL) runs the server, so these commands need no
token themselves. `create` prints the token alone on stdout, once — `export FUSIONWATCH_TOKEN=$(fusionwatch
token create ci --project bert)` — and everything else on stderr.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from service.cli_support import err
from service.console import stdout_console

token_app = typer.Typer(help="API tokens: who may upload, post results and acknowledge alerts, and who may read.",
                        no_args_is_help=True)


def _on_database(step):
    """Run `step(services)` on the configured database; errors exit 2 with one line."""
    from service.adapters.db import make_engine
    from service.cli_support import guarded, require_migrated
    from service.core.config import settings
    from service.errors import ServiceError
    from service.services import worker_services

    require_migrated()
    engine = make_engine(settings.database_url)
    try:
        services = worker_services(engine, settings)
        return guarded(lambda: step(services))
    except ServiceError as error:
        err.print(f"[red]error:[/red] {error.message}", highlight=False)
        raise typer.Exit(2) from error
    finally:
        engine.dispose()


@token_app.command("create")
def create_command(
    name: Annotated[str, typer.Argument(help="who or what holds it, e.g. ci-bert or alice")],
    scope: Annotated[str, typer.Option("--scope", help="write (also reads) or read")] = "write",
    project: Annotated[str | None, typer.Option("--project", help="write to this project only")] = None,
) -> None:
    """Make a token and print it once; only its SHA-256 is stored."""
    from service.commands.create_token import create_token

    created = _on_database(lambda services: create_token(services, name, scope, project))
    where = f"project {project!r} only" if project else "every project"
    err.print(f"token {name!r}: scope {scope}, {where}. Shown once; store it now "
              "(clients read it from FUSIONWATCH_TOKEN).", highlight=False)
    print(created.token)


@token_app.command("list")
def list_command() -> None:
    """Every token: its first characters, scope, project and when it was last used (never the token)."""
    from service.queries.tokens import tokens

    def rows(services):
        return [(t.name, t.prefix, t.scope, project or "all", _when(t.created_at), _when(t.last_used_at),
                 _when(t.revoked_at)) for t, project in tokens(services)]

    table = Table("name", "starts with", "scope", "project", "created", "last used", "revoked")
    for row in _on_database(rows):
        table.add_row(*row)
    stdout_console().print(table)


@token_app.command("revoke")
def revoke_command(name: Annotated[str, typer.Argument(help="the token's name")]) -> None:
    """Stop a token working, at once; the row stays, for the record."""
    from service.commands.revoke_token import revoke_token

    _on_database(lambda services: revoke_token(services, name))
    err.print(f"token {name!r} is revoked", highlight=False)


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "–"
