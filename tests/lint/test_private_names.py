"""No module imports another module's private names (a leading underscore): what a module shares, it
names publicly; shared test helpers live in helper modules or fixtures, not in another test module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ("optimizer", "runtime", "service", "tests", "bench", "tools")


def private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if node.module.split(".")[0] in OURS and private:
                found.append(f"{node.module}: {', '.join(private)}")
    return found


def test_no_private_name_is_imported_from_another_module():
    offenders = {}
    for path in sorted(p for package in OURS for p in (ROOT / package).rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if hits := private_imports(path):
            offenders[name] = hits
    assert offenders == {}


def test_the_check_sees_a_private_import(tmp_path):
    module = tmp_path / "pool.py"
    module.write_text("from runtime.kernels.conv import Conv, _read_auto_pad\nfrom numpy import _private_ok\n")
    assert private_imports(module) == ["runtime.kernels.conv: _read_auto_pad"]
