"""GET /api/v1/models and /api/v1/models/{id}: what was uploaded, and its latest report per level."""

from __future__ import annotations

import hashlib

from tests.optimizer.test_driver import _mlp

LEVELS = ["disabled", "basic", "extended", "layout", "all"]


def _upload(client, name: str, data: bytes, **form) -> dict:
    response = client.post("/api/v1/optimize", files={"model": (name, data)}, data=form)
    assert response.status_code == 200, response.text
    return response.json()


def test_upload_then_list_then_read_back(client):
    data = _mlp(gelu_domain="", opset=20).SerializeToString()
    uploaded = _upload(client, "mlp.onnx", data)

    listed = client.get("/api/v1/models").json()
    assert listed["count"] == 1
    (summary,) = listed["data"]
    assert summary["id"] == uploaded["model_id"]
    assert summary["name"] == "mlp.onnx"
    assert summary["sha256"] == hashlib.sha256(data).hexdigest()
    assert summary["size_bytes"] == len(data)
    assert summary["opset"] == 20

    detail = client.get(f"/api/v1/models/{uploaded['model_id']}").json()
    assert {key: detail[key] for key in summary} == summary
    assert list(detail["reports"]) == LEVELS
    assert detail["reports"] == uploaded["levels"]
    assert detail["reports"]["all"]["fusions"] == {"com.microsoft.BiasGelu": 1}


def test_a_duplicate_upload_reuses_the_model_and_its_latest_runs_win(client):
    data = _mlp().SerializeToString()
    first = _upload(client, "first.onnx", data)
    second = _upload(client, "renamed.onnx", data, level="extended")
    assert second["model_id"] == first["model_id"]
    assert (first["model_is_new"], second["model_is_new"]) == (True, False)

    listed = client.get("/api/v1/models").json()
    assert listed["count"] == 1
    assert listed["data"][0]["name"] == "first.onnx"  # the first upload names the model

    reports = client.get(f"/api/v1/models/{first['model_id']}").json()["reports"]
    assert list(reports) == LEVELS
    assert reports["extended"]["id"] == second["levels"]["extended"]["id"]
    assert reports["extended"]["id"] > first["levels"]["extended"]["id"]
    assert reports["all"]["id"] == first["levels"]["all"]["id"]


def test_different_models_are_listed_in_upload_order_and_paged(client):
    ids = [
        _upload(client, f"m{opset}.onnx", _mlp(opset=opset).SerializeToString(), level="basic")["model_id"]
        for opset in (13, 14, 17)
    ]
    assert len(set(ids)) == 3
    assert [m["id"] for m in client.get("/api/v1/models").json()["data"]] == ids
    page = client.get("/api/v1/models", params={"skip": 1, "limit": 1}).json()
    assert page["count"] == 3 and [m["id"] for m in page["data"]] == ids[1:2]


def test_a_model_with_no_runs_at_a_level_omits_that_level(client):
    uploaded = _upload(client, "m.onnx", _mlp().SerializeToString(), level="layout")
    assert list(client.get(f"/api/v1/models/{uploaded['model_id']}").json()["reports"]) == ["layout"]


def test_unknown_model_is_404_with_the_id_named(client):
    assert client.get("/api/v1/models").json() == {"data": [], "count": 0}
    response = client.get("/api/v1/models/4242")
    assert response.status_code == 404
    assert response.json()["detail"] == "no model with id 4242; GET /api/v1/models lists the stored ones"


def test_malformed_ids_and_paging_are_422(client):
    assert client.get("/api/v1/models/abc").status_code == 422
    assert client.get("/api/v1/models", params={"limit": 0}).status_code == 422
    assert client.get("/api/v1/models", params={"skip": -1}).status_code == 422
