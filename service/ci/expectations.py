"""Expected fused-op counts checked in beside the models (`fusionwatch.toml`), as PyTorch's tests keep
expected graph-break counts: per model, engine and level, how many of each fused op the optimizer must
keep making. A count below its expectation is a drop (the check fails); above it, or a model × engine ×
level the file does not name yet, is news the file can take (`--update`).

The file is TOML, one table per model × engine × level, keys the fused ops' keys:

    ["models/bert.onnx".fusionwatch.extended]
    "com.microsoft.BiasGelu" = 2

Models are named by their path relative to the file's folder, so the file holds wherever the repository
is checked out. An empty table is an expectation too: that level fuses nothing.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from optimizer import LEVEL_NAMES

Counts = dict[str, int]
Key = tuple[str, str, str]  # model, engine, level
MAX_FILE_BYTES = 4 * 1024 * 1024
HEADER = ("# Expected fused-op counts per model, engine and level: `fusionwatch check` fails when a count drops\n"
          "# below its expectation; `fusionwatch check --update` rewrites this file from what the optimizer makes now.\n")


class ExpectationsError(Exception):
    """The expectations file cannot be read; the message names the file and the entry."""


@dataclass(frozen=True)
class Difference:
    key: Key
    op: str
    expected: int
    measured: int

    @property
    def dropped(self) -> bool:
        return self.measured < self.expected


def model_key(model: Path, expectations: Path) -> str:
    """The model's path relative to the file's folder (as given, when it lies elsewhere)."""
    folder = expectations.resolve().parent
    try:
        return model.resolve().relative_to(folder).as_posix()
    except ValueError:
        return model.as_posix()


def read(path: Path) -> dict[Key, Counts]:
    if not path.exists():
        return {}
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ExpectationsError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ExpectationsError(f"{path}: not TOML ({error})") from error
    expected: dict[Key, Counts] = {}
    for model, engines in data.items():
        for engine, levels in _table(path, engines, model).items():
            for level, counts in _table(path, levels, f"{model}.{engine}").items():
                where = f"{model}.{engine}.{level}"
                table = _table(path, counts, where)
                bad = [op for op, count in table.items() if not isinstance(count, int) or isinstance(count, bool) or count < 0]
                if bad:
                    raise ExpectationsError(f"{path}: [{where}] {bad[0]!r} must be a count (a whole number ≥ 0)")
                expected[(model, engine, level)] = dict(table)
    return expected


def compare(expected: dict[Key, Counts], measured: dict[Key, Counts]) -> tuple[list[Difference], list[Key]]:
    """Every count that differs from its expectation, and the measured keys the file does not name."""
    differences, unknown = [], []
    for key, counts in measured.items():
        if key not in expected:
            unknown.append(key)
            continue
        for op in sorted(set(expected[key]) | set(counts)):
            want, got = expected[key].get(op, 0), counts.get(op, 0)
            if want != got:
                differences.append(Difference(key, op, want, got))
    return differences, unknown


def write(path: Path, expectations: dict[Key, Counts]) -> None:
    lines = [HEADER]
    order = {level: i for i, level in enumerate(LEVEL_NAMES)}
    for (model, engine, level), counts in sorted(expectations.items(), key=lambda e: (e[0][:2], order.get(e[0][2], 99), e[0])):
        lines.append(f"\n[{_quoted(model)}.{_quoted(engine)}.{_quoted(level)}]\n")
        lines += [f"{_quoted(op)} = {count}\n" for op, count in sorted(counts.items()) if count]
    path.write_text("".join(lines), encoding="utf-8")


def _table(path: Path, value, where: str) -> dict:
    if not isinstance(value, dict):
        raise ExpectationsError(f"{path}: {where!r} must be a table of model → engine → level → counts")
    return value


def _quoted(text: str) -> str:
    # A JSON string is a TOML basic string (the same escapes), and always a valid key.
    return json.dumps(text, ensure_ascii=False)
