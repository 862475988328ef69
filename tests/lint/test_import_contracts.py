"""`make lint`'s import check (lint-imports with pyproject.toml's contracts) passes on the code as it is,
and fails when a change adds an import cycle, an upward import between the service's layers, or an
import of the service from runtime/: each case is a copy of the packages with one import added, inside
a function body (where cycles used to hide)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The three packages' Python files and pyproject.toml, copied where an edit harms nothing."""
    for package in ("optimizer", "runtime", "service"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=lambda _, names: [n for n in names if n == "__pycache__" or
                                                 (Path(n).suffix and Path(n).suffix != ".py")])
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def lint_imports(checkout: Path) -> subprocess.CompletedProcess:
    if not LINT_IMPORTS.is_file():
        pytest.fail(f"{LINT_IMPORTS} is missing: `make install-dev` installs import-linter (the dev extra)")
    env = os.environ | {"PYTHONPATH": str(checkout)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=300)


def add_function_import(module: Path, statement: str) -> None:
    module.write_text(module.read_text() + f"\n\ndef _added_by_the_test():\n    {statement}\n")


def test_the_code_keeps_its_contracts(checkout):
    run = lint_imports(checkout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_a_cycle_inside_a_function_fails(checkout):
    # service.domain.timing imports stats at the top; stats importing timing back closes a cycle.
    add_function_import(checkout / "service/domain/stats.py", "from service.domain import timing  # noqa")
    run = lint_imports(checkout)
    assert run.returncode != 0
    assert "No import cycles BROKEN" in run.stdout
    assert "No cycles are allowed in service.domain." in run.stdout


def test_a_domain_module_importing_a_command_fails(checkout):
    add_function_import(checkout / "service/domain/protocol.py", "from service.commands import post_results  # noqa")
    run = lint_imports(checkout)
    assert run.returncode != 0
    assert "The service's layers" in run.stdout and "BROKEN" in run.stdout
    assert "service.domain.protocol -> service.commands.post_results" in run.stdout


def test_a_route_importing_a_table_step_fails(checkout):
    add_function_import(checkout / "service/api/routes/runs.py", "from service.usecases import runs  # noqa")
    run = lint_imports(checkout)
    assert run.returncode != 0
    assert "service.api.routes.runs -> service.usecases.runs" in run.stdout


def test_the_runtime_importing_the_service_fails(checkout):
    add_function_import(checkout / "runtime/session.py", "import service.adapters.engines  # noqa")
    run = lint_imports(checkout)
    assert run.returncode != 0
    assert "service -> runtime -> optimizer BROKEN" in run.stdout
