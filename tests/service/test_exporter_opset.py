"""The same BERT exported at opset 14 and at opset 17 (tools/make_fixtures.py) runs the same fused ops:
at 14 LayerNormFusion makes the five LayerNormalizations, at 17 the exporter writes them. Submitted
in either order, neither engine raises a fusion-regression and `submit --fail-on-regression` passes."""

from __future__ import annotations

import onnx

from tests.service.serving import api_get, api_post, serving
from tests.service.test_cli_submit import submit_export

OPSET_14 = "tests/models/bert_torchscript_opset14.onnx"
OPSET_17 = "tests/models/bert_torchscript_opset17.onnx"
SETTINGS = {"runs": 2, "warmup": 0, "levels": ["disabled", "extended"], "threads": 1, "sequence_length": 16}


def test_an_exporter_opset_change_is_green_in_either_order(tmp_path, database_url):
    exports = []
    for index, source in enumerate((OPSET_14, OPSET_17, OPSET_14)):
        (tmp_path / str(index)).mkdir()
        exports.append(tmp_path / str(index) / "bert.onnx")
        onnx.save(onnx.load(source), exports[-1])
    shas = ["a14" * 13 + "a", "b17" * 13 + "b", "c14" * 13 + "c"]
    with serving(tmp_path, database_url) as (base, _server):
        assert api_post(f"{base}/projects", json={"name": "bert-exports", "settings": SETTINGS}).status_code == 201
        for index, (sha, export) in enumerate(zip(shas, exports, strict=True)):
            parent = ["--parent", shas[index - 1]] if index else []
            step = submit_export(base, sha, export, "--wait", "--fail-on-regression", *parent)
            assert step.returncode == 0, step.stdout + step.stderr
            assert "verdict: ok" in step.stdout
        listed = api_get(f"{base}/alerts", params={"project": "bert-exports", "kind": "fusion-regression"}).json()
        assert listed["total"] == 0, listed
        runs = [api_get(f"{base}/alerts", params={"project": "bert-exports"}).json()]
        assert all(a["kind"] != "fusion-regression" for r in runs for a in r["items"])
