"""docker-compose.yml and the Dockerfile, checked without Docker: every fusionwatch command they run
exists and its options parse, the api and the worker share the database, the broker and the models
volume, and every service has a healthcheck that could run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from service.cli import app

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def _fusionwatch_invocations(command: list[str] | str) -> list[list[str]]:
    """The `fusionwatch ...` argument lists in a compose or Dockerfile command (`sh -c "a && b"` included)."""
    words = shlex.split(command) if isinstance(command, str) else list(command)
    if words[:2] == ["sh", "-c"]:
        steps = [shlex.split(step) for step in words[2].split("&&")]
    else:
        steps = [words]
    steps = [step[1:] if step[:1] == ["exec"] else step for step in steps]
    return [step[1:] for step in steps if step[:1] == ["fusionwatch"]]


def _assert_parses(args: list[str]) -> None:
    """Resolve the subcommand chain and parse its options as the real CLI would, without running it."""
    command = typer.main.get_command(app)
    rest, path = list(args), []
    while hasattr(command, "commands"):  # a group: the next word names a subcommand
        name = rest.pop(0)
        path.append(name)
        assert name in command.commands, f"fusionwatch has no command {' '.join(path)!r}"
        command = command.commands[name]
    command.make_context(" ".join(path), rest)  # raises a UsageError on an unknown option or a bad value
    helped = CliRunner().invoke(app, [*path, "--help"])
    assert helped.exit_code == 0, helped.output


def test_the_stack_has_its_four_services_each_with_a_healthcheck():
    assert set(SERVICES) == {"postgres", "redis", "api", "worker"}
    for name, service in SERVICES.items():
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL"), name
        if test[1:3] == ["python", "-c"]:
            compile(test[3], f"{name} healthcheck", "exec")


def test_every_fusionwatch_command_exists_and_parses():
    invocations = {name: _fusionwatch_invocations(s["command"]) for name, s in SERVICES.items() if "command" in s}
    assert invocations == {
        "api": [["db", "upgrade"], ["serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]],
        "worker": [["worker", "--queue", "cpu", "--concurrency", "1"]],
    }
    cmd = next(line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD "))
    invocations["Dockerfile"] = _fusionwatch_invocations(json.loads(cmd.removeprefix("CMD ")))
    for steps in invocations.values():
        for args in steps:
            _assert_parses(args)


def test_a_misspelt_option_would_be_caught():
    with pytest.raises(Exception, match="No such option: --queues"):
        _assert_parses(["worker", "--queues", "cpu"])
    with pytest.raises(AssertionError, match="no command 'wroker'"):
        _assert_parses(["wroker"])
    with pytest.raises(Exception, match="greater than or equal to 1"):
        _assert_parses(["worker", "--concurrency", "0"])


def test_api_and_worker_share_the_database_broker_and_models_volume():
    api, worker = SERVICES["api"], SERVICES["worker"]
    assert api["environment"] == worker["environment"]
    env = api["environment"]
    assert env["FUSIONWATCH_DATABASE_URL"].startswith("postgresql+psycopg://") and "@postgres:" in env["FUSIONWATCH_DATABASE_URL"]
    assert env["FUSIONWATCH_BROKER_URL"].startswith("redis://redis:")
    volume = f"models:{env['FUSIONWATCH_DATA_DIR']}"
    assert volume in api["volumes"] and volume in worker["volumes"]
    assert set(COMPOSE["volumes"]) >= {"models", "postgres"}
    # The worker checks the schema at start: it waits for the api, which migrates first.
    assert worker["depends_on"]["api"]["condition"] == "service_healthy"
    assert {api["depends_on"][s]["condition"] for s in ("postgres", "redis")} == {"service_healthy"}
