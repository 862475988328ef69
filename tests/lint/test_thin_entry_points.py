"""Routes, pages, the workers and the CLI parse, call one command or query, and serialize: none of them
reads or writes tables itself. Checked on their source: no SQLAlchemy import, no statement built, and no
session method called (a session handed to a query is fine), and no adapter that writes the database on
its own (the job queue's claims, the schema's migrations) imported: those are commands' and queries' to
call. Catching SQLAlchemy's errors is allowed: a route answers a lost database with 503."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINTS = sorted([
    *(ROOT / "service/api/routes").glob("*.py"),
    *(ROOT / "service/web").glob("*.py"),
    *(ROOT / "service/worker").glob("*.py"),
    *(ROOT / "service").glob("cli*.py"),
    ROOT / "service/app.py",
])
SESSION_METHODS = {"execute", "scalar", "scalars", "get", "add", "add_all", "delete", "query", "merge", "begin",
                   "begin_nested", "commit", "flush", "rollback", "refresh"}
STATEMENTS = {"select", "insert", "update", "delete", "text"}
WRITING_ADAPTERS = {"service.adapters.queue", "service.adapters.migrate"}


def table_access(source: str) -> list[str]:
    """Each place in `source` that touches the database directly, as 'line N: what'."""
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom):  # `from service.adapters import queue` imports the module too
                names += [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in WRITING_ADAPTERS]
            found += [(node.lineno, node.col_offset, f"line {node.lineno}: imports {n}") for n in names
                      if (n.split(".")[0] == "sqlalchemy" and n != "sqlalchemy.exc") or n in WRITING_ADAPTERS]
        elif isinstance(node, ast.Call):
            called = node.func
            if isinstance(called, ast.Name) and called.id in STATEMENTS:
                found.append((node.lineno, node.col_offset, f"line {node.lineno}: builds {called.id}(...)"))
            elif (isinstance(called, ast.Attribute) and called.attr in SESSION_METHODS
                  and isinstance(called.value, ast.Name) and "session" in called.value.id.lower()):
                found.append((node.lineno, node.col_offset, f"line {node.lineno}: {called.value.id}.{called.attr}(...)"))
    return [what for *_, what in sorted(found)]


def test_entry_points_leave_the_tables_to_commands_and_queries():
    assert len(ENTRY_POINTS) > 15
    offenders = {str(path.relative_to(ROOT)): hits for path in ENTRY_POINTS if (hits := table_access(path.read_text()))}
    assert offenders == {}


def test_the_check_sees_a_route_that_queries_a_table():
    route = '''
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

def read_metrics(session):
    jobs = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    with session.begin():
        session.add(Job())
'''
    assert table_access(route) == [
        "line 2: imports sqlalchemy", "line 6: session.execute(...)", "line 6: builds select(...)",
        "line 7: session.begin(...)", "line 8: session.add(...)",
    ]


def test_the_check_sees_an_entry_point_that_claims_jobs_or_migrates_itself():
    worker = '''
from service.adapters import queue
from service.adapters.migrate import upgrade
from service.adapters.db import make_engine
'''
    assert table_access(worker) == [
        "line 2: imports service.adapters.queue", "line 3: imports service.adapters.migrate",
    ]
