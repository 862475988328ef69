"""POST /api/v1/optimize: upload a model, get the optimizer's report per level."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.app import create_app
from tests.optimizer.test_driver import _mlp

client = TestClient(create_app())


def test_health_lists_levels_and_rules():
    body = client.get("/api/v1/health").json()
    assert body["status"] == "ok"
    assert body["levels"] == ["disabled", "basic", "extended", "layout", "all"]
    assert "BiasGeluFusion" in body["rules"]


def test_upload_reports_every_level():
    files = {"model": ("mlp.onnx", _mlp(gelu_domain="", opset=20).SerializeToString())}
    body = client.post("/api/v1/optimize", files=files).json()
    assert body["model"] == "mlp.onnx"
    assert list(body["levels"]) == ["disabled", "basic", "extended", "layout", "all"]
    assert body["levels"]["disabled"]["fusions"] == {}
    assert body["levels"]["all"]["fusions"] == {"com.microsoft.BiasGelu": 1}


def test_upload_one_level():
    files = {"model": ("mlp.onnx", _mlp().SerializeToString())}
    body = client.post("/api/v1/optimize", files=files, data={"level": "extended"}).json()
    assert list(body["levels"]) == ["extended"]


def test_bad_uploads_are_422_with_the_problem_named():
    garbage = client.post("/api/v1/optimize", files={"model": ("x.onnx", b"\x00\x01garbage")})
    assert garbage.status_code == 422 and "x.onnx" in garbage.json()["detail"]
    level = client.post(
        "/api/v1/optimize", files={"model": ("m.onnx", _mlp().SerializeToString())}, data={"level": "max"}
    )
    assert level.status_code == 422 and "max" in level.json()["detail"]
