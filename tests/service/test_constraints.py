"""The database itself rejects rows the service must never store, whatever code writes them."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy.exc import IntegrityError

from optimizer import LEVEL_NAMES
from service.models import OnnxModel, OptimizerRun


def _model(session, content: bytes = b"model") -> OnnxModel:
    model = OnnxModel(name="m.onnx", sha256=hashlib.sha256(content).hexdigest(), size_bytes=len(content), opset=17)
    session.add(model)
    session.flush()
    return model


def _run(model_id: int, **overrides) -> OptimizerRun:
    values = dict(
        model_id=model_id,
        level="all",
        graph_hash="0123456789abcdef",
        nodes_before=3,
        nodes_after=2,
        total_ms=1.5,
        ops_after={"MatMul": 1},
        fusions={},
        rules={},
        near_misses=[],
    )
    return OptimizerRun(**(values | overrides))


def test_every_optimizer_level_is_accepted(session):
    model = _model(session)
    session.add_all([_run(model.id, level=level) for level in LEVEL_NAMES])
    session.flush()
    assert session.query(OptimizerRun).count() == len(LEVEL_NAMES)


@pytest.mark.parametrize(
    "overrides",
    [
        {"level": "max"},
        {"level": "ALL"},
        {"total_ms": -0.001},
        {"nodes_before": -1},
        {"nodes_after": -1},
        {"model_id": 999_999},  # no such model: the foreign key (SQLite enforces it only when asked)
    ],
    ids=["unknown-level", "level-case", "negative-time", "negative-nodes-before", "negative-nodes-after", "no-model"],
)
def test_bad_optimizer_runs_are_rejected(session, overrides):
    model = _model(session)
    session.commit()
    session.add(_run(model.id, **overrides) if "model_id" not in overrides else _run(**overrides))
    with pytest.raises(IntegrityError):
        session.flush()
    session.rollback()
    assert session.query(OptimizerRun).count() == 0
    assert session.query(OnnxModel).count() == 1


@pytest.mark.parametrize(
    "overrides",
    [{"sha256": "abc"}, {"size_bytes": 0}],
    ids=["short-sha256", "empty-model"],
)
def test_bad_models_are_rejected(session, overrides):
    values = dict(name="m.onnx", sha256="a" * 64, size_bytes=10, opset=17)
    session.add(OnnxModel(**(values | overrides)))
    with pytest.raises(IntegrityError):
        session.flush()


def test_a_model_is_stored_once_per_sha256(session):
    _model(session, b"same bytes")
    session.add(OnnxModel(name="other.onnx", sha256=hashlib.sha256(b"same bytes").hexdigest(), size_bytes=10))
    with pytest.raises(IntegrityError):
        session.flush()


def test_deleting_a_model_deletes_its_runs(session):
    model = _model(session)
    session.add(_run(model.id))
    session.commit()
    session.delete(model)
    session.commit()
    assert session.query(OptimizerRun).count() == 0
