"""Done-when 1 of the service issue: a model repository's CI posts commits A and B of a BERT export;
B's export has a custom op between the MLP's bias Add and its GELU. B's run raises exactly one
fusion-regression for the lost BiasGelu, listing each affected engine and level, with before → after
counts and the near miss that names the custom op, and the alert reaches the project's webhook receiver."""

from __future__ import annotations

import json

import onnx
import pytest

from tests.service.custom_op_plugin import insert_before_gelu
from tests.service.jobs import drain
from tests.service.receiver import Receiver

BERT = "tests/models/bert_torchscript_opset14.onnx"
PLUGIN = "tests.service.custom_op_plugin"
SETTINGS = {"runs": 2, "warmup": 0, "levels": ["disabled", "extended"], "threads": 1, "sequence_length": 16}


def _post_commit(client, sha, parents, model_bytes):
    payload = {"project": "bert-exports", "sha": sha, "branch": "main", "parents": parents, "message": f"export {sha}"}
    response = client.post(
        "/api/v1/webhooks/ci",
        data={"payload": json.dumps(payload)},
        files=[("files", ("bert.onnx", model_bytes, "application/octet-stream"))],
    )
    assert response.status_code == 202, response.text
    return response.json()


@pytest.fixture
def service_settings(service_settings):
    return service_settings.model_copy(update={"custom_ops": PLUGIN})


def test_custom_op_between_add_and_gelu_raises_one_fusion_regression_listing_each_engine_level(client, tmp_path):
    receiver = Receiver()
    with receiver:
        assert client.post("/api/v1/projects", json={"name": "bert-exports", "settings": SETTINGS}).status_code == 201
        hook = client.post("/api/v1/projects/bert-exports/hooks", json={"url": receiver.url, "format": "json"})
        assert hook.status_code == 201

        a = _post_commit(client, "a" * 40, [], open(BERT, "rb").read())
        assert a["jobs"] == 4 and a["models"] == ["bert.onnx"]
        assert drain(client) == 4
        run_a = client.get(a["run_url"]).json()
        assert run_a["verdict"] == "ok", run_a
        assert run_a["alerts"] == []

        exported_b = insert_before_gelu(onnx.load(BERT)).SerializeToString()
        b = _post_commit(client, "b" * 40, ["a" * 40], exported_b)
        assert drain(client) == 4
        run_b = client.get(b["run_url"]).json()
        assert run_b["verdict"] == "regression"
        regressions = {x["op"]: x for x in run_b["alerts"] if x["kind"] == "fusion-regression"}
        # Our engine also loses three of its four SkipLayerNormalizations there: an alert of its own.
        assert sorted(regressions) == ["com.microsoft.BiasGelu", "com.microsoft.SkipLayerNormalization"]
        assert [e["engine"] for e in regressions["com.microsoft.SkipLayerNormalization"]["engines"]] == ["fusionwatch"]
        alert = regressions["com.microsoft.BiasGelu"]
        # BiasGelu fires at extended in both engines, never at disabled.
        assert sorted((e["engine"], e["level"]) for e in alert["engines"]) == [
            ("fusionwatch", "extended"), ("onnxruntime", "extended")
        ]
        assert alert["op"] == "com.microsoft.BiasGelu" and alert["rule"] == "BiasGeluFusion"
        assert (alert["before"], alert["after"]) == (2, 0)
        assert all((c["before"], c["after"]) == (2, 0) for c in alert["changes"])
        assert alert["commit"] == "b" * 40 and alert["baseline_commit"] == "a" * 40
        assert "ai.onnx.contrib.Passthrough" in alert["message"] and "custom op" in alert["message"]
        assert any("custom op" in m["reason"] for m in alert["near_misses"])
        # The structural diff: the custom op now stands between the bias Add and the GELU's chain.
        assert "ai.onnx.contrib.Passthrough" in alert["cause"]["structure"]["now"]
        # Its repro pair, verified: by our engine where onnxruntime has no library for the custom op.
        assert alert["repro_url"], (alert["repro_error"], alert["cause"]["looked_at"])
        assert client.get(alert["repro_url"]).status_code == 200
        assert client.get(alert["repro_url"], params={"side": "baseline"}).status_code == 200
        listed = client.get("/api/v1/alerts", params={"project": "bert-exports", "kind": "fusion-regression"}).json()
        assert listed["total"] == 2
        received = receiver.wait_for(lambda bodies: sum(b["alert"]["kind"] == "fusion-regression" for b in bodies) >= 2)
    kinds = [body["alert"]["kind"] for body in received]
    assert kinds.count("fusion-regression") == 2
    assert all(body["alert"]["project"] == "bert-exports" for body in received)
