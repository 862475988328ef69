"""Issue 29's paired path through the service: a job whose baseline file is stored times both in one
process, alternately, and the timing verdict is the paired one; POST /results takes paired samples."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from service.adapters.paired_measure import WORTH_MAX_SECONDS, measure_rule_worth
from service.domain.protocol import Protocol
from tests.service.jobs import drain

BERT = "tests/models/bert_torchscript_opset14.onnx"
SETTINGS = {"runs": 5, "warmup": 1, "levels": ["extended"], "engines": ["fusionwatch"], "threads": 1,
            "sequence_length": 16}


def _slower(path, tmp_path, products: int = 40):
    """The model with a chain of 128×128 products added as an extra output, fed from input_ids so no
    optimizer folds it away: the same graph plus several times its work."""
    model = onnx.load(path)
    graph = model.graph
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32) / 12, "slow_w")
    graph.initializer.append(weight)
    graph.node.extend([
        helper.make_node("Cast", ["input_ids"], ["slow_ids"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["slow_ids"], ["slow_scale"], keepdims=0),
        helper.make_node("Mul", ["slow_w", "slow_scale"], ["slow_0"]),
    ])
    for i in range(products):
        graph.node.append(helper.make_node("MatMul", [f"slow_{i}", "slow_w"], [f"slow_{i + 1}"]))
    graph.output.append(helper.make_tensor_value_info(f"slow_{products}", TensorProto.FLOAT, [128, 128]))
    out = tmp_path / "slower.onnx"
    onnx.save(model, out)
    return out


def _resaved(path, tmp_path):
    """The same model with another doc string: another file (another sha256), the same work."""
    model = onnx.load(path)
    model.doc_string = "re-exported"
    out = tmp_path / "resaved.onnx"
    onnx.save(model, out)
    return out


def _post_commit(client, sha, parents, path):
    payload = {"project": "bert", "sha": sha, "branch": "main", "parents": parents, "message": f"export {sha[:4]}"}
    files = [("files", ("bert.onnx", open(path, "rb").read(), "application/octet-stream"))]
    response = client.post("/api/v1/webhooks/ci", data={"payload": json.dumps(payload)}, files=files)
    assert response.status_code == 202, response.text
    assert drain(client) == 1
    return client.get(response.json()["run_url"]).json()


def _paired_of(client, sha):
    [entry] = client.get(f"/api/v1/commits/{sha}/diff", params={"project": "bert"}).json()["models"]
    return entry["paired"]


def test_a_slower_model_is_regressed_on_paired_blocks_and_an_identical_one_is_within_noise(client, tmp_path):
    assert client.post("/api/v1/projects", json={"name": "bert", "settings": SETTINGS}).status_code == 201
    a, b, c = "a" * 40, "b" * 40, "c" * 40
    assert _post_commit(client, a, [], BERT)["verdict"] == "ok"
    assert _paired_of(client, a) is None  # nothing stored to pair with

    run_b = _post_commit(client, b, [a], _resaved(BERT, tmp_path))
    paired_b = _paired_of(client, b)
    assert paired_b["baseline_commit"] == a and paired_b["source"] == "measured"
    assert paired_b["word"] in ("within noise", "inconclusive") and paired_b["word"] != "regressed"
    assert len(paired_b["baseline_ms"]) == len(paired_b["candidate_ms"]) == paired_b["pairs"] >= 6
    assert paired_b["machine_s"] > 0 and paired_b["stopped"]
    assert not [x for x in run_b["alerts"] if x["kind"] == "timing-regression"]

    run_c = _post_commit(client, c, [b], _slower(BERT, tmp_path))
    paired_c = _paired_of(client, c)
    assert paired_c["word"] == "regressed" and paired_c["ratio"] > 1.5 and paired_c["low"] > 1
    assert re.fullmatch(r"regressed after (\d+) pairs, and again on the \1 pairs after", paired_c["stopped"])
    [alert] = [x for x in run_c["alerts"] if x["kind"] == "timing-regression"]
    assert alert["state"] == "confirmed"  # no re-measurement: a slow moment slowed both sides
    assert "candidate / baseline = " in alert["message"] and "paired blocks" in alert["message"]
    assert f"against baseline {b[:12]}" in alert["message"]
    # Its why: both files profiled alternately after the verdict; the 40 added products are MatMul time.
    kernels = paired_c["kernels"]
    matmul = {side: next(k["ms"] for k in kernels[side] if k["op"] == "MatMul") for side in ("baseline", "candidate")}
    assert matmul["candidate"] > 2 * matmul["baseline"]
    assert "the kernels that moved most, both files profiled alternately" in alert["message"]
    assert re.search(r"moved most, [^:]*: MatMul [\d.]+ → [\d.]+ ms", alert["message"])
    page = client.get(f"/projects/bert/commits/{c}").text
    assert "Largest per-kernel time changes (ms), both files profiled alternately in the paired job" in page
    assert "kernels" not in paired_b  # within noise: no profile asked for


def _document(sha, parents, execute_ms, baseline=None):
    result = {"model": "bert.onnx", "engine": "onnxruntime", "engine_version": "1.20.1", "level": "extended",
              "fusions": {"com.microsoft.BiasGelu": 2}, "execute_ms": execute_ms}
    if baseline is not None:
        result["baseline"] = baseline
    return {"project": "engine", "commit": {"sha": sha, "parents": parents}, "results": [result]}


def test_posted_paired_samples_are_decided_by_the_server_and_stored(client):
    assert client.post("/api/v1/projects", json={"name": "engine", "kind": "engine"}).status_code == 201
    a, b, c = "1" * 40, "2" * 40, "3" * 40
    rng = np.random.default_rng(5)
    assert client.post("/api/v1/results", json=_document(a, [], list(1 + rng.random(20) / 50))).status_code == 201

    # A whole-job slowdown of +100% on both sides: the ratios stay at 1, and nothing is raised.
    base = 2 * (1 + rng.random(20) / 50)
    slow_both = _document(b, [a], list(base * (1 + rng.random(20) / 100)), {"commit": a, "execute_ms": list(base)})
    reply = client.post("/api/v1/results", json=slow_both)
    assert reply.status_code == 201, reply.text
    assert not reply.json()["alerts"]

    base = 1 + rng.random(20) / 50
    step = _document(c, [b], list(base * 1.12), {"commit": b, "execute_ms": list(base)})
    reply = client.post("/api/v1/results", json=step)
    [alert] = reply.json()["alerts"]
    assert alert["kind"] == "timing-regression" and alert["state"] == "confirmed"
    assert "candidate / baseline = 1.120 [1.120, 1.120] over 20 paired blocks" in alert["message"]
    assert "posted with the result" in alert["message"]
    [entry] = client.get(f"/api/v1/commits/{c}/diff", params={"project": "engine"}).json()["models"]
    paired = entry["paired"]
    assert entry["timing"]["word"] == "regressed" and entry["timing"]["basis"] == "paired"
    assert paired["source"] == "posted" and paired["word"] == "regressed" and paired["pairs"] == 20
    # The commit page leads with the detector's word; each job's own median follows, said to be context.
    page = client.get(f"/projects/engine/commits/{c}").text
    assert "regressed</span> <small>candidate / baseline" in page
    assert "+12.0% on the blocks timed side by side" in page
    assert "each job's own median" in page and "context, not what was decided on" in page
    # The jobs' medians are shown as they are, with no change of their own beside the verdict's.
    medians = page[page.index("each job's own median"):page.index("context, not what was decided on")]
    assert "%" not in medians


def test_paired_samples_of_unequal_length_are_refused_naming_the_field(client):
    assert client.post("/api/v1/projects", json={"name": "engine", "kind": "engine"}).status_code == 201
    reply = client.post("/api/v1/results", json=_document("4" * 40, [], [1.0] * 5, {"commit": "5" * 40, "execute_ms": [1.0] * 4}))
    assert reply.status_code == 422
    assert "baseline.execute_ms has 4 samples and execute_ms 5" in reply.text


def _constant_work(tmp_path):
    """x + (W @ W @ W @ W), W a 256×256 constant, x four such planes: ConstantFolding leaves one Add of
    256K values, without it every run multiplies three 256×256 products. (With x one plane a run took
    11 µs, and two sessions of the same graph differed by 5% for a whole job: a session's own layout,
    which no pairing of blocks can see.)"""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32) / 16, "w")
    nodes = [helper.make_node("MatMul", ["w", "w"], ["w2"]), helper.make_node("MatMul", ["w2", "w"], ["w3"]),
             helper.make_node("MatMul", ["w3", "w"], ["w4"]), helper.make_node("Add", ["x", "w4"], ["y"])]
    graph = helper.make_graph(nodes, "constant_work", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256, 256])], [w])
    path = tmp_path / "constant_work.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_rules_worth_is_the_same_file_timed_with_and_without_it_alternately(tmp_path):
    path = _constant_work(tmp_path)
    protocol = Protocol(threads=1)
    worth = measure_rule_worth(path, "fusionwatch", "basic", "ConstantFolding", protocol)
    assert worth.verdict.word == "regressed" and worth.verdict.low > 1.5  # three products a run, against an Add
    assert len(worth.baseline_ms) == len(worth.candidate_ms) == worth.verdict.pairs
    assert 0 < worth.machine_s <= WORTH_MAX_SECONDS * 2  # a second try at most
    nothing = measure_rule_worth(path, "fusionwatch", "basic", "GeluFusion", protocol)  # fires nowhere here
    assert nothing.verdict.word != "regressed"


def test_a_worth_whose_budget_ends_before_an_interval_is_stored_as_json_can_hold_it(tmp_path, monkeypatch):
    from service.adapters import paired_measure
    from service.usecases.cost import lost_fusion_cost

    monkeypatch.setattr(paired_measure, "WORTH_MAX_SECONDS", 0.0)  # one pair a try, too few for an interval
    cost = lost_fusion_cost("com.microsoft.BiasGelu", "ConstantFolding", "fusionwatch", "basic",
                            _constant_work(tmp_path), Protocol(threads=1))
    assert cost["word"] == "inconclusive" and cost["pairs"] == 1 and cost["high"] is None
    assert "without it a run takes" in cost["text"] and "(too few pairs for an interval)" in cost["text"]
    json.dumps(cost, allow_nan=False)  # PostgreSQL's JSON has no Infinity
