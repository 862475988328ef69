"""POST /results documents a hostile client writes: numbers a column cannot hold or that make no sense as
data, names that are paths or carry NUL, megabyte strings. Each is a 422 naming the field, and nothing
from the document is stored (no commit, run, model, machine or result row)."""

from __future__ import annotations

import copy
import json

import pytest
from sqlalchemy import func, select

from service.models import Commit, Machine, Model, Result, Run

ONE_MB = "x" * 1024**2


def good_document() -> dict:
    return {
        "project": "engine",
        "commit": {"sha": "c1", "branch": "main", "parents": ["c0"], "message": "a change"},
        "machine": {"machine_class": "cpu", "cpu": "test cpu", "cores": 2, "isa": ["avx2"]},
        "results": [{
            "model": "bert.onnx", "engine": "onnxruntime", "engine_version": "1.20.0", "level": "extended",
            "fusions": {"BiasGelu": 2}, "ops_after": {"MatMul": 3}, "nodes_before": 10,
            "nodes_after": 8, "threads": 1, "execute_ms": [1.0, 1.1, 0.9], "model_run_ms": [1.2],
            "near_misses": [{"rule": "BiasGeluFusion", "anchor": "/mlp/Gelu", "step": "gelu", "reason": "domain"}],
            "rules": {"BiasGeluFusion": {"fired": 2, "ms": 0.5}}, "top_kernels": [{"op": "MatMul", "ms": 0.7}],
            "inputs": {"input_ids": "int64[1, 128]"}, "max_abs_error": 1e-6, "max_rel_error": 1e-5,
            "numeric_ok": True, "peak_bytes": 1024, "session_ms": 12.0, "canary_ms": 3.0,
        }],
    }


def _with(path: str, value) -> dict:
    """The good document with the field at `path` (dots; digits index lists) set to `value`."""
    document = copy.deepcopy(good_document())
    *parents, last = path.split(".")
    here = document
    for part in parents:
        here = here[int(part)] if part.isdigit() else here[part]
    here[int(last) if last.isdigit() else last] = value
    return document


CASES = [
    # Integers beyond their column (OverflowError from the database before).
    ("results.0.peak_bytes", 1e30), ("results.0.nodes_before", 1e30), ("results.0.nodes_after", 2**31),
    ("results.0.threads", 1e30), ("results.0.fusions.BiasGelu", 1e30),
    ("results.0.ops_after.MatMul", -1), ("machine.cores", 1e30),
    # Timings and errors that are not finite, positive and bounded.
    ("results.0.execute_ms.1", float("nan")), ("results.0.execute_ms.0", float("inf")),
    ("results.0.execute_ms.2", 1e300), ("results.0.model_run_ms.0", -1.0),
    ("results.0.max_abs_error", float("nan")), ("results.0.max_abs_error", float("inf")),
    ("results.0.max_rel_error", 1e300), ("results.0.session_ms", float("nan")), ("results.0.session_ms", 1e300),
    ("results.0.canary_ms", float("inf")), ("results.0.rules.BiasGeluFusion.ms", float("nan")),
    # Names that are paths or carry NUL.
    ("results.0.model", ".."), ("results.0.model", "nul\0name"), ("results.0.model", "../x.onnx"),
    ("commit.parents.0", "../../etc/passwd"), ("commit.sha", ".."), ("commit.branch", "main\0"),
    ("results.0.engine_version", "1.0\0"), ("project", "engine\0"),
    # Megabyte strings (10 MB ones were stored whole before; those are now over the body's limit, below).
    ("results.0.near_misses.0.reason", ONE_MB), ("results.0.top_kernels.0.op", ONE_MB),
    ("results.0.rules", {ONE_MB: {"fired": 1, "ms": 1.0}}), ("machine.cpu", ONE_MB),
    ("results.0.inputs", {"x": ONE_MB}), ("commit.message", ONE_MB),
    # Lists and shapes beyond what a client writes.
    ("results.0.near_misses", [{"rule": "R", "anchor": "a", "reason": "r"}] * 501),
    ("results.0.top_kernels.0", {"op": "MatMul", "ms": 1.0, "extra": [[[]]]}),
    ("results.0.near_misses.0", {"rule": "R", "anchor": "a", "reason": "r", "nested": {"a": {"b": 1}}}),
]


@pytest.fixture
def project(client):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()


def _stored(session) -> tuple[int, ...]:
    session.rollback()
    return tuple(session.scalar(select(func.count()).select_from(t)) for t in (Commit, Run, Model, Machine, Result))


def _post(client, document: dict):
    # json.dumps writes NaN and Infinity, as a hostile client's serializer may.
    body = json.dumps(document).encode()
    return client.post("/api/v1/results", content=body, headers={"content-type": "application/json"})


def test_a_good_document_is_stored(client, project, session):
    reply = _post(client, good_document())
    assert reply.status_code == 201, reply.text
    assert _stored(session) == (1, 1, 1, 1, 1)


@pytest.mark.parametrize(("path", "value"), CASES, ids=[f"{p}={str(v)[:12]!r}" for p, v in CASES])
def test_a_field_out_of_bounds_is_422_naming_it_and_nothing_is_stored(client, project, session, path, value):
    reply = _post(client, _with(path, value))
    assert reply.status_code == 422, reply.text[:500]
    detail = reply.json()["detail"]
    named = path.rsplit(".", 1)[0] if path.startswith(("results.0.fusions", "results.0.ops_after", "results.0.rules")) \
        else path.split(".0.")[0] if path.endswith((".near_misses", ".rules", ".inputs")) else path
    assert f"body.{named}" in detail, detail
    assert len(reply.text) < 2000  # the value is never quoted back whole
    assert _stored(session) == (0, 0, 0, 0, 0)


@pytest.mark.parametrize("path", ["results.0.near_misses.0.reason", "results.0.top_kernels.0.op", "machine.cpu"])
def test_a_10mb_string_is_413_at_the_door_and_nothing_is_stored(client, project, session, path):
    reply = _post(client, _with(path, "x" * (10 * 1024**2)))
    assert reply.status_code == 413 and "at most 8388608 here" in reply.json()["detail"], reply.text[:300]
    assert _stored(session) == (0, 0, 0, 0, 0)
