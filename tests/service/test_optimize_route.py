"""POST /api/v1/optimize: upload a model, get the optimizer's report per level, and keep it."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import func, select

from service import crud
from service.models import OnnxModel, OptimizerRun
from tests.optimizer.test_driver import _mlp

LEVELS = ["disabled", "basic", "extended", "layout", "all"]


def _counts(session) -> tuple[int, int]:
    session.rollback()  # a fresh transaction, so this sees what the app committed
    return (
        session.scalar(select(func.count()).select_from(OnnxModel)),
        session.scalar(select(func.count()).select_from(OptimizerRun)),
    )


def test_health_lists_levels_and_rules(client):
    body = client.get("/api/v1/health").json()
    assert body["status"] == "ok"
    assert body["levels"] == LEVELS
    assert "BiasGeluFusion" in body["rules"]


def test_upload_reports_every_level_and_stores_them(client, session):
    data = _mlp(gelu_domain="", opset=20).SerializeToString()
    response = client.post("/api/v1/optimize", files={"model": ("mlp.onnx", data)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "mlp.onnx"
    assert body["model_is_new"] is True
    assert list(body["levels"]) == LEVELS
    assert body["levels"]["disabled"]["fusions"] == {}
    assert body["levels"]["all"]["fusions"] == {"com.microsoft.BiasGelu": 1}
    assert body["levels"]["all"]["ops_after"] == {"MatMul": 1, "com.microsoft.BiasGelu": 1}

    model = session.get(OnnxModel, body["model_id"])
    assert (model.name, model.sha256, model.size_bytes, model.opset) == (
        "mlp.onnx",
        hashlib.sha256(data).hexdigest(),
        len(data),
        20,
    )
    runs = session.scalars(select(OptimizerRun).where(OptimizerRun.model_id == model.id)).all()
    assert sorted(run.level for run in runs) == sorted(LEVELS)
    stored_all = next(run for run in runs if run.level == "all")
    assert stored_all.fusions == {"com.microsoft.BiasGelu": 1}
    assert stored_all.nodes_before == 3 and stored_all.nodes_after == 2
    assert stored_all.graph_hash == body["levels"]["all"]["graph_hash"]
    assert stored_all.rules["BiasGeluFusion"]["fired"] == 1


def test_upload_one_level(client, session):
    body = client.post(
        "/api/v1/optimize", files={"model": ("mlp.onnx", _mlp().SerializeToString())}, data={"level": "extended"}
    ).json()
    assert list(body["levels"]) == ["extended"]
    assert _counts(session) == (1, 1)


def test_near_misses_are_stored_with_their_message(client, session):
    data = _mlp(extra_outputs=["a"]).SerializeToString()
    body = client.post("/api/v1/optimize", files={"model": ("m.onnx", data)}, data={"level": "extended"}).json()
    misses = body["levels"]["extended"]["near_misses"]
    assert any(m["rule"] == "BiasGeluFusion" and m["anchor"] == "/mlp/Gelu" for m in misses)
    for miss in misses:
        assert miss["message"] == f"{miss['rule']} at {miss['anchor']}: {miss['reason']}"
    session.rollback()
    stored = session.scalars(select(OptimizerRun)).one()
    assert stored.near_misses == misses


@pytest.mark.parametrize(
    ("files", "form", "named"),
    [
        ({"model": ("x.onnx", b"\x00\x01garbage")}, {}, "x.onnx"),
        ({"model": ("m.onnx", _mlp().SerializeToString())}, {"level": "max"}, "max"),
        ({"model": ("empty.onnx", b"")}, {}, "empty.onnx"),
        ({"model": ("long" * 80 + ".onnx", _mlp().SerializeToString())}, {}, "at most 255"),
    ],
    ids=["garbage", "unknown-level", "empty-file", "long-name"],
)
def test_bad_uploads_are_422_with_the_problem_named_and_store_nothing(client, session, files, form, named):
    response = client.post("/api/v1/optimize", files=files, data=form)
    assert response.status_code == 422 and named in response.json()["detail"]
    assert _counts(session) == (0, 0)


def test_an_upload_failing_mid_write_stores_nothing_and_keeps_earlier_data(client, session, monkeypatch):
    first = client.post("/api/v1/optimize", files={"model": ("a.onnx", _mlp().SerializeToString())})
    assert first.status_code == 200
    assert _counts(session) == (1, 5)

    real_add_runs = crud.add_runs

    def add_runs_then_fail(db_session, model, reports):
        real_add_runs(db_session, model, reports)  # the model and its runs are flushed, not committed
        raise RuntimeError("disk full")

    monkeypatch.setattr(crud, "add_runs", add_runs_then_fail)
    other = _mlp(gelu_domain="", opset=20).SerializeToString()
    with pytest.raises(RuntimeError, match="disk full"):
        client.post("/api/v1/optimize", files={"model": ("b.onnx", other)})
    assert _counts(session) == (1, 5)
    assert session.scalars(select(OnnxModel.name)).all() == ["a.onnx"]
