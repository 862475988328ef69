"""The benchmark models, exported once with random weights and cached under bench/cache/ (not in git)."""

from __future__ import annotations

from pathlib import Path

CACHE = Path(__file__).parent / "cache"

# name -> (exporter call, feeds builder); sizes follow the issue: BERT-base and GPT-2 small at
# sequence 128, ResNet-50 at 224x224.
MODELS = {
    "bert_base": dict(
        kind="bert", exporter="torchscript", layers=12, hidden=768, heads=12, intermediate=3072,
        seq=128, vocab=30522, opset=14,
    ),
    "gpt2_small": dict(
        kind="gpt2", exporter="torchscript", layers=12, hidden=768, heads=12, intermediate=3072,
        seq=128, vocab=50257, opset=14,
    ),
    "resnet50": dict(kind="resnet"),
}

# Small models, where a run is mostly per-node work rather than products (issue 31): the tiny
# BERT and GPT-2 of the issue (hidden 128, 2 layers, TorchScript exporter at opset 17, the real
# position tables so that sequence 128 fits), exported here rather than taken from tests/models,
# whose fixtures hold 64 positions and are what the tests were written against.
SMALL_MODELS = {
    "bert_tiny": dict(
        kind="bert", exporter="torchscript", layers=2, hidden=128, heads=2, intermediate=512,
        seq=16, vocab=1000, opset=17,
    ),
    "gpt2_tiny": dict(
        kind="gpt2", exporter="torchscript", layers=2, hidden=128, heads=2, intermediate=512,
        seq=16, vocab=1000, opset=17,
    ),
}

# What the fusions save (bench/level_savings.py): the DistilBERT of the report that our `extended`
# ran no faster than `disabled` (dim 256, 4 heads, hidden_dim 1024, TorchScript at opset 17,
# sequence 32).
LEVEL_MODELS = {
    "distilbert_small": dict(
        kind="distilbert", exporter="torchscript", layers=2, hidden=256, heads=4, intermediate=1024,
        seq=32, vocab=1000, opset=17,
    ),
}


def model_path(name: str) -> Path:
    """The cached model file, exported on first use (needs the `export` extra)."""
    path = CACHE / f"{name}.onnx"
    if path.is_file():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    from tools.make_fixtures import export_hf, export_resnet  # torch: only here, only when exporting

    spec = dict(MODELS.get(name) or SMALL_MODELS.get(name) or LEVEL_MODELS[name])
    kind = spec.pop("kind")
    if kind == "resnet":
        export_resnet(path, depth=50, image=224)
    else:
        exporter = spec.pop("exporter")
        export_hf(kind, exporter, path, **spec)
    return path
