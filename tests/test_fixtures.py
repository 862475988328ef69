"""Sanity checks for the committed ONNX fixtures in tests/models/ (made by tools/make_fixtures.py).

The optimizer and runtime tests rely on these files containing specific op patterns; the op
counts asserted here are those facts, so a regenerated fixture that silently changes shape
(e.g. a new exporter that fuses attention itself) fails here first, with a clear message,
instead of deep inside an optimizer test.

Needs only onnx + onnxruntime (the reference executor), not torch.
"""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.oracle import MODELS, fixture_feeds, run_onnxruntime

REPO = Path(__file__).parent.parent
MAX_BYTES = 1_000_000
HIDDEN = 64
FIXTURE_INPUTS = {"input_ids", "attention_mask", "token_type_ids", "position_ids", "pixel_values"}

# Per fixture: opset, and exact counts of the ops the optimizer's fusion tests key on.
# 0 means "must be absent" (e.g. opset-14 files cannot contain LayerNormalization).
# Plumbing ops (Shape/Gather/Unsqueeze/Concat...) are deliberately not pinned.
EXPECTED: dict[str, tuple[int, dict[str, int]]] = {
    # opset 14: LayerNorm decomposed (ReduceMean x2, Sub, Pow, Add, Sqrt, Div per LN; 5 LNs),
    # erf GELU (x*0.5*(1+Erf(x/sqrt2))) once per layer, SDPA -> MatMul/Softmax + IsNaN guard.
    "bert_torchscript_opset14.onnx": (14, {
        "MatMul": 16, "Softmax": 2, "Erf": 2, "ReduceMean": 10, "Pow": 5, "Sqrt": 5,
        "IsNaN": 2, "Gemm": 1, "Tanh": 1, "LayerNormalization": 0, "Gelu": 0,
    }),
    # eager attention: MatMul(Q,K^T) -> Mul(1/sqrt(d)) -> Add(mask) -> Softmax -> MatMul(V),
    # no IsNaN guard (the mask uses finfo.min, not -inf).
    "bert_eager_torchscript_opset14.onnx": (14, {
        "MatMul": 16, "Softmax": 2, "Erf": 2, "ReduceMean": 10, "Pow": 5, "Sqrt": 5,
        "IsNaN": 0, "Gemm": 1, "Tanh": 1, "LayerNormalization": 0, "Gelu": 0,
    }),
    # opset 20: the exporter emits LayerNormalization and the Gelu op (approximate="none"),
    # so no Erf and no ReduceMean; attention still decomposed (Attention op needs opset 23).
    "bert_dynamo_opset20.onnx": (20, {
        "MatMul": 16, "Softmax": 2, "LayerNormalization": 5, "Gelu": 2, "IsNaN": 2,
        "Gemm": 1, "Tanh": 1, "Erf": 0, "ReduceMean": 0, "Attention": 0,
    }),
    # Exported at batch 1, sequence 16 with no dynamic axes: every shape is a number, so the
    # shape arithmetic folds away (no Shape ops; dynamo leaves none, TorchScript two).
    "bert_static_torchscript_opset14.onnx": (14, {
        "MatMul": 16, "Softmax": 2, "Erf": 2, "ReduceMean": 10, "Pow": 5, "Sqrt": 5,
        "IsNaN": 2, "Gemm": 1, "Tanh": 1, "Shape": 2, "LayerNormalization": 0, "Gelu": 0,
    }),
    "bert_static_dynamo_opset20.onnx": (20, {
        "MatMul": 16, "Softmax": 2, "LayerNormalization": 5, "Gelu": 2, "IsNaN": 2,
        "Gemm": 1, "Tanh": 1, "Shape": 0, "Erf": 0, "ReduceMean": 0, "Attention": 0,
    }),
    # bert_dynamo_opset20 with its inputs pinned to [1, 16] afterwards: the dynamic export's
    # Shape/Slice/Range arithmetic is still there, and no intermediate shapes are stored.
    "bert_pinned_dynamo_opset20.onnx": (20, {
        "MatMul": 16, "Softmax": 2, "LayerNormalization": 5, "Gelu": 2, "IsNaN": 2,
        "Gemm": 1, "Tanh": 1, "Shape": 5, "Erf": 0, "ReduceMean": 0, "Attention": 0,
    }),
    # GPT-2 Conv1D = addmm -> Gemm (c_attn, attn c_proj, c_fc, mlp c_proj per layer);
    # fused QKV is Split; gelu_new = 0.5x(1+tanh(sqrt(2/pi)(x+0.044715 x^3))) -> Pow + Tanh.
    "gpt2_torchscript_opset14.onnx": (14, {
        "Gemm": 8, "MatMul": 4, "Softmax": 2, "Split": 2, "Tanh": 2, "Pow": 7,
        "ReduceMean": 10, "Sqrt": 5, "IsNaN": 2, "LayerNormalization": 0, "Erf": 0, "Gelu": 0,
    }),
    # gelu_new stays a Pow/Tanh formula even at opset 20 (it is not torch's gelu(tanh)).
    "gpt2_dynamo_opset20.onnx": (20, {
        "Gemm": 8, "MatMul": 4, "Softmax": 2, "Split": 2, "Tanh": 2, "Pow": 2,
        "LayerNormalization": 5, "IsNaN": 2, "ReduceMean": 0, "Erf": 0, "Gelu": 0, "Attention": 0,
    }),
    # Exported as users export them (USER config: intermediate 128). Without token_type_ids the
    # token-type embedding is a Gather from a constant buffer expanded to the batch (GatherElements).
    "bert_notype_torchscript_opset14.onnx": (14, {
        "MatMul": 16, "Softmax": 2, "Erf": 2, "ReduceMean": 10, "Pow": 5, "Sqrt": 5,
        "GatherElements": 1, "IsNaN": 2, "Gemm": 1, "LayerNormalization": 0, "Gelu": 0,
    }),
    # RoBERTa numbers positions from the input ids (padding id 1): Not(Equal) -> CumSum.
    "roberta_notype_torchscript_opset14.onnx": (14, {
        "MatMul": 16, "Softmax": 2, "Erf": 2, "ReduceMean": 10, "CumSum": 1, "GatherElements": 1,
        "IsNaN": 2, "LayerNormalization": 0, "Gelu": 0,
    }),
    # use_cache=True: each layer's key and value are concatenated onto the (empty) cache and are
    # also graph outputs (present_*), 4 Concat more than gpt2_torchscript_opset14.
    "gpt2_cache_torchscript_opset14.onnx": (14, {
        "Gemm": 8, "MatMul": 4, "Softmax": 2, "Split": 2, "Tanh": 2, "Pow": 7, "Concat": 35,
        "ReduceMean": 10, "Sqrt": 5, "IsNaN": 2, "LayerNormalization": 0, "Erf": 0, "Gelu": 0,
    }),
    # Llama-style: RMSNorm (Pow, ReduceMean, Add, Sqrt, Div at 14; Reciprocal at 20), rotary
    # embedding (one shared Cos/Sin, Neg per rotate_half), 4 query / 2 key-value heads, SiLU
    # (x * Sigmoid(x)) gating; q/k/v/o and gate/up/down are bias-free MatMuls.
    "llama_torchscript_opset14.onnx": (14, {
        "MatMul": 18, "Softmax": 2, "ReduceMean": 5, "Pow": 5, "Sqrt": 5, "Cos": 1, "Sin": 1,
        "Neg": 4, "Sigmoid": 2, "IsNaN": 2, "RMSNormalization": 0, "RotaryEmbedding": 0,
    }),
    "llama_dynamo_opset20.onnx": (20, {
        "MatMul": 18, "Softmax": 2, "ReduceMean": 5, "Pow": 5, "Reciprocal": 5, "Cos": 1, "Sin": 1,
        "Neg": 4, "Sigmoid": 2, "IsNaN": 2, "RMSNormalization": 0, "RotaryEmbedding": 0,
    }),
    # opset 23: the dynamo exporter emits the standard Attention, RMSNormalization and
    # RotaryEmbedding ops itself (Q/K/V projections and the MLP stay MatMuls).
    "llama_dynamo_opset23.onnx": (23, {
        "MatMul": 14, "RMSNormalization": 5, "RotaryEmbedding": 4, "Attention": 2, "Sigmoid": 2,
        "Softmax": 0, "ReduceMean": 0, "Neg": 0,
    }),
    "bert_dynamo_opset23.onnx": (23, {
        "MatMul": 12, "Attention": 2, "LayerNormalization": 5, "Gelu": 2, "Gemm": 1, "Tanh": 1,
        "Softmax": 0, "Erf": 0, "ReduceMean": 0,
    }),
    "gpt2_dynamo_opset23.onnx": (23, {
        "Gemm": 8, "Attention": 2, "LayerNormalization": 5, "Split": 2, "Tanh": 2, "Pow": 2,
        "Softmax": 0, "MatMul": 0, "ReduceMean": 0, "Gelu": 0,
    }),
    # bert_torchscript_opset14 re-exported with a rewritten activation (the changes issue 27's
    # verdict tests make): gelu_new is the tanh approximation (Pow/Tanh per layer, no Erf) ...
    "bert_tanhgelu_torchscript_opset14.onnx": (14, {
        "MatMul": 16, "Softmax": 2, "Erf": 0, "ReduceMean": 10, "Pow": 7, "Sqrt": 5,
        "IsNaN": 2, "Gemm": 1, "Tanh": 3, "Sigmoid": 0, "LayerNormalization": 0, "Gelu": 0,
    }),
    # ... and quick_gelu is x * Sigmoid(1.702 x), one Sigmoid per layer.
    "bert_quickgelu_torchscript_opset14.onnx": (14, {
        "MatMul": 16, "Softmax": 2, "Erf": 0, "ReduceMean": 10, "Pow": 5, "Sqrt": 5,
        "IsNaN": 2, "Gemm": 1, "Tanh": 1, "Sigmoid": 2, "LayerNormalization": 0, "Gelu": 0,
    }),
    # The same model at opset 17: the exporter writes LayerNormalization itself (no ReduceMean),
    # the GELU stays Erf.
    "bert_torchscript_opset17.onnx": (17, {
        "MatMul": 16, "Softmax": 2, "Erf": 2, "ReduceMean": 0, "Pow": 0, "Sqrt": 0,
        "IsNaN": 2, "Gemm": 1, "Tanh": 1, "LayerNormalization": 5, "Gelu": 0,
    }),
    # BatchNorm is already folded into Conv by the TorchScript exporter (eval mode).
    "resnet_tiny_opset17.onnx": (17, {
        "Conv": 9, "Relu": 7, "Add": 2, "MaxPool": 1, "GlobalAveragePool": 1,
        "BatchNormalization": 0,
    }),
}

FIXTURES = sorted(EXPECTED)
# Batch 1, sequence 16 only: every input and output dimension is a number.
STATIC_FIXTURES = {"bert_static_torchscript_opset14.onnx", "bert_static_dynamo_opset20.onnx",
                   "bert_pinned_dynamo_opset20.onnx"}


def _load(name: str) -> onnx.ModelProto:
    return onnx.load(str(MODELS / name))


def _histogram(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _feeds(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, np.ndarray]:
    """Random but valid inputs (see tests/oracle.py), for exactly the inputs the exporters write."""
    feeds = fixture_feeds(model, batch, seq)
    assert set(feeds) <= FIXTURE_INPUTS, f"unexpected fixture inputs {sorted(set(feeds) - FIXTURE_INPUTS)}"
    return feeds


def test_fixture_set_is_complete():
    on_disk = sorted(p.name for p in MODELS.glob("*.onnx"))
    assert on_disk == FIXTURES, "tests/models/*.onnx and EXPECTED disagree; run `make fixtures`"
    # Self-contained files only: the dynamo exporter writes <name>.onnx.data by default.
    assert not list(MODELS.glob("*.data")), "external-data side files found"


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_is_valid_and_small(name):
    path = MODELS / name
    assert path.stat().st_size < MAX_BYTES, f"{name} is {path.stat().st_size} bytes"
    model = _load(name)
    onnx.checker.check_model(model, full_check=True)
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    opset, _ = EXPECTED[name]
    assert [(o.domain, o.version) for o in model.opset_import] == [("", opset)]
    # Only standard ONNX ops: the optimizer is what introduces fused/contrib ops.
    assert {n.domain for n in model.graph.node} <= {""}


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_op_histogram(name):
    _, expected = EXPECTED[name]
    hist = _histogram(_load(name))
    actual = {op: hist.get(op, 0) for op in expected}
    assert actual == expected


def test_bert_gelu_is_exact():
    # BERT uses exact (erf) GELU, GPT-2 the tanh approximation (Pow/Tanh, see EXPECTED);
    # a GELU fusion must not turn one into the other.
    gelus = [n for n in _load("bert_dynamo_opset20.onnx").graph.node if n.op_type == "Gelu"]
    approx = {
        onnx.helper.get_attribute_value(a) for n in gelus for a in n.attribute if a.name == "approximate"
    }
    assert approx <= {b"none"}


def test_layernorm_epsilons():
    # BERT and GPT-2 use different epsilons; a LayerNorm fusion must carry them over.
    def eps(name):
        return {
            onnx.helper.get_attribute_value(a)
            for n in _load(name).graph.node if n.op_type == "LayerNormalization"
            for a in n.attribute if a.name == "epsilon"
        }
    # Attributes are float32, hence the np.float32 round trip.
    assert eps("bert_dynamo_opset20.onnx") == {np.float32(1e-12).item()}
    assert eps("gpt2_dynamo_opset20.onnx") == {np.float32(1e-5).item()}


# (2, 8) proves the batch/sequence axes really are dynamic in every dynamic exporter's output;
# the static files take (1, 16) only (test_static_fixture_has_no_symbolic_dims).
RUN_SIZES = [
    (name, batch, seq)
    for name in FIXTURES
    for batch, seq in [(1, 16), (2, 8)]
    if name not in STATIC_FIXTURES or (batch, seq) == (1, 16)
]


@pytest.mark.parametrize("name,batch,seq", RUN_SIZES)
def test_fixture_runs_in_onnxruntime(name, batch, seq):
    model = _load(name)
    outs = run_onnxruntime(model, _feeds(model, batch, seq))
    for output, out in outs.items():
        assert out.dtype == np.float32, output
        assert out.shape[0] == batch, output
        assert np.isfinite(out).all(), f"{name}:{output} has non-finite values"
    if name.startswith(("bert", "gpt2", "roberta", "llama")):
        assert outs["last_hidden_state"].shape == (batch, seq, HIDDEN)
    else:
        assert outs["last_hidden_state"].shape == (batch, 32, 4, 4)


@pytest.mark.parametrize("name", sorted(STATIC_FIXTURES))
def test_static_fixture_has_no_symbolic_dims(name):
    model = _load(name)
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), f"{name}: {value.name} has a symbolic dimension"
        assert [d.dim_value for d in dims][:2] == [1, 16 if value.name != "pooler_output" else HIDDEN]
    if name.startswith("bert_pinned"):
        assert not model.graph.value_info  # inference must rediscover every intermediate shape


def test_inventory_is_current():
    # INVENTORY.txt is what the optimizer engineers read; keep it in sync with the files.
    spec = importlib.util.spec_from_file_location("inventory", REPO / "tools" / "inventory.py")
    inventory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inventory)
    expected = "\n\n".join(inventory.describe(MODELS / n) for n in FIXTURES) + "\n"
    assert (MODELS / "INVENTORY.txt").read_text() == expected, "run `make fixtures` (or tools/inventory.py)"


@pytest.mark.parametrize("name", [n for n in FIXTURES if n.startswith(("bert", "gpt2", "roberta", "llama"))])
def test_attention_mask_is_live(name):
    # transformers skips the mask when it is all ones; an export that traced that shortcut would
    # ignore attention_mask, and mask-handling bugs in attention fusions would go unnoticed.
    model = _load(name)
    feeds = _feeds(model, 1, 16)
    feeds["attention_mask"] = np.ones((1, 16), dtype=np.int64)
    full = run_onnxruntime(model, feeds)["last_hidden_state"]
    feeds["attention_mask"][0, :4] = 0  # hide the first tokens from every query
    masked = run_onnxruntime(model, feeds)["last_hidden_state"]
    assert np.abs(full[0, -1] - masked[0, -1]).max() > 1e-3
