"""A realistic history for the dashboard's tests, posted through POST /api/v1/results as
`fusionwatch run --server` would post it: no engine runs, a few seconds for dozens of commits.

Project `bert-exports`, model `bert.onnx` measured by both engines at levels disabled and extended
(four series), model `gpt2.onnx` by ours at extended. Along main:
- commit TIMING_STEP: our executor's extended median steps up by 40% (a timing-regression);
- commit FUSION_DROP: onnxruntime's BiasGelu stops firing at extended (2 → 0, a fusion-regression whose
  near miss names the custom op in the way), and Gelu appears unfused in the op histogram;
- commit FUSION_BACK: BiasGelu fuses again (a fusion-change).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

PROJECT = "bert-exports"
COMMITS = 40
TIMING_STEP = 15
FUSION_DROP = 25
FUSION_BACK = 32
START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)

BERT_EXTENDED = {"com.microsoft.Attention": 2, "com.microsoft.BiasGelu": 2, "com.microsoft.FusedGemm": 1,
                 "com.microsoft.SkipLayerNormalization": 4}
GPT2_EXTENDED = {"com.microsoft.FastGelu": 2, "com.microsoft.SkipLayerNormalization": 2, "com.microsoft.Attention": 2}
BIAS_GELU_NEAR_MISS = {
    "rule": "BiasGeluFusion", "anchor": "/encoder/layer.0/intermediate/Gelu", "step": "bias",
    "reason": "input of com.microsoft.Gelu comes from ai.onnx.contrib.Passthrough 'custom_0' "
              "(custom op, a fusion barrier), not Add",
    "barrier": "ai.onnx.contrib.Passthrough",
}


def sha(index: int) -> str:
    return f"{index:04d}{'c0ffee'}{index * 7919 % 65536:04x}ab"  # 16 hex-ish characters, stable per index


def message(index: int) -> str:
    if index == TIMING_STEP:
        return "runtime: plan buffers per run (slower arena)"
    if index == FUSION_DROP:
        return "export: custom Passthrough between bias Add and Gelu"
    if index == FUSION_BACK:
        return "export: drop the Passthrough again"
    return f"commit {index}: routine change to the exporter"


def _samples(rng: random.Random, median: float, runs: int = 20) -> list[float]:
    return [round(median * (1 + rng.gauss(0, 0.015)), 4) for _ in range(runs)]


def _result(rng: random.Random, model: str, engine: str, level: str, index: int) -> dict:
    base = {"bert.onnx": 1.2, "gpt2.onnx": 2.4}[model] * (1.0 if engine == "fusionwatch" else 1.1)
    fusions: dict[str, int] = {}
    # As a TorchScript export at opset 14 runs unoptimized: no op there is a product of fusion.
    ops = {"MatMul": 14, "Add": 12, "Erf": 2, "ReduceMean": 10, "Softmax": 2}
    near_misses: list[dict] = []
    if level == "extended":
        base *= 0.55
        fusions = dict(BERT_EXTENDED if model == "bert.onnx" else GPT2_EXTENDED)
        ops = {"MatMul": 6, **fusions}  # the posted counts agree with the posted graph (POST /results recounts)
    if engine == "fusionwatch" and level == "extended" and index >= TIMING_STEP:
        base *= 1.4
    if (model, engine, level) == ("bert.onnx", "onnxruntime", "extended") and FUSION_DROP <= index < FUSION_BACK:
        fusions.pop("com.microsoft.BiasGelu")
        ops = dict(ops, **{"com.microsoft.BiasGelu": 0, "Gelu": 2, "Add": 2, "ai.onnx.contrib.Passthrough": 2})
        ops = {op: n for op, n in ops.items() if n}
        near_misses = [BIAS_GELU_NEAR_MISS, dict(BIAS_GELU_NEAR_MISS, anchor="/encoder/layer.1/intermediate/Gelu")]
        base *= 1.3
    kernels = [{"op": "MatMul", "ms": round(base * 0.5, 4)}, {"op": "Attention", "ms": round(base * 0.2, 4)},
               {"op": "BiasGelu" if "com.microsoft.BiasGelu" in fusions else "Gelu", "ms": round(base * 0.1, 4)}]
    return {
        "model": model, "engine": engine, "engine_version": "1.32.0" if engine == "onnxruntime" else "0.1.0",
        "level": level, "fusions": fusions, "ops_after": ops, "near_misses": near_misses,
        "nodes_after": sum(ops.values()), "execute_ms": _samples(rng, base), "top_kernels": kernels,
    }


def documents(commits: int = COMMITS, seed: int = 11) -> list[dict]:
    """The POST /results documents, oldest commit first."""
    rng = random.Random(seed)
    series = [("bert.onnx", e, lv) for e in ("fusionwatch", "onnxruntime") for lv in ("disabled", "extended")]
    series.append(("gpt2.onnx", "fusionwatch", "extended"))
    docs = []
    for index in range(commits):
        docs.append({
            "project": PROJECT,
            "commit": {"sha": sha(index), "branch": "main", "parents": [sha(index - 1)] if index else [],
                       "message": message(index), "author": "ci@example.com",
                       "timestamp": (START + timedelta(hours=3 * index)).isoformat()},
            "machine": {"machine_class": "cpu", "cpu": "AMD EPYC", "cores": 2},
            "results": [_result(rng, *key, index) for key in series],
        })
    return docs


def seed(post, commits: int = COMMITS) -> list[dict]:
    """Create the project and post the history with `post(path, json=...)` (an httpx or TestClient post);
    returns the replies, each with the alerts it raised."""
    reply = post("/api/v1/projects", json={"name": PROJECT, "settings": {"levels": ["disabled", "extended"]}})
    assert reply.status_code == 201, reply.text
    replies = []
    for document in documents(commits):
        reply = post("/api/v1/results", json=document)
        assert reply.status_code == 201, reply.text
        replies.append(reply.json())
    return replies
