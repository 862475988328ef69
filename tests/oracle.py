"""The oracle helpers shared by the optimizer tests.

onnxruntime with ALL of its graph optimizations off is the oracle: an optimized model must give
the same outputs as the original on the same feeds. fp32 tolerances are rtol 1e-3, atol 1e-4;
a test that needs looser ones passes them to `assert_same_outputs` and says why next to the call.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from optimizer import OptimizeResult, optimize

MODELS = Path(__file__).resolve().parent / "models"
RTOL, ATOL = 1e-3, 1e-4
FIXTURE_VOCAB = 1000  # the tiny HF configs in tools/make_fixtures.py


def _as_proto(model: onnx.ModelProto | ir.Model | OptimizeResult) -> onnx.ModelProto:
    if isinstance(model, OptimizeResult):
        model = model.model
    return ir.to_proto(model) if isinstance(model, ir.Model) else model


def fixture_feeds(
    model: onnx.ModelProto | ir.Model | OptimizeResult,
    batch: int = 2,
    seq: int = 16,
    seed: int = 0,
    *,
    vocab: int = FIXTURE_VOCAB,
) -> dict[str, np.ndarray]:
    """Valid inputs for the exported fixtures and the hand-built patterns, read from the graph inputs.

    A symbolic first dimension becomes `batch`, any other symbolic one `seq`. Token ids are drawn
    below `vocab`; attention_mask pads the last quarter of the last row (so masking is exercised);
    token_type_ids switch to 1 halfway; position_ids count up; float inputs are standard normal.
    An input none of these rules covers is an error that names it, not a guess.
    """
    proto = _as_proto(model)
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in proto.graph.initializer}
    feeds = {}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (batch if axis == 0 else seq)
            for axis, d in enumerate(tensor.shape.dim)
        )
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, vocab, shape).astype(dtype)
        elif value.name == "attention_mask":
            mask = np.ones(shape, dtype)
            mask[-1, shape[-1] - shape[-1] // 4:] = 0
            feeds[value.name] = mask
        elif value.name == "token_type_ids":
            types = np.zeros(shape, dtype)
            types[..., shape[-1] // 2:] = 1
            feeds[value.name] = types
        elif value.name == "position_ids":
            feeds[value.name] = np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        elif np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            raise AssertionError(f"fixture_feeds has no rule for input '{value.name}' ({dtype.name}{list(shape)})")
    return feeds


def run_onnxruntime(model: onnx.ModelProto | ir.Model | OptimizeResult, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs by name, from onnxruntime's CPU provider with every graph optimization off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # fused models leave the absorbed weights unused: expected, not news
    session = ort.InferenceSession(_as_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def assert_same_outputs(
    original: onnx.ModelProto | ir.Model | OptimizeResult,
    optimized: onnx.ModelProto | ir.Model | OptimizeResult,
    feeds: dict[str, np.ndarray] | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> float:
    """Both models in onnxruntime on the same feeds (`fixture_feeds(original)` unless given):
    the same output names in the same order, every output allclose. Returns the largest absolute
    difference, for tests that want a change to be visible."""
    feeds = fixture_feeds(original) if feeds is None else feeds
    expected = run_onnxruntime(original, feeds)
    actual = run_onnxruntime(optimized, feeds)
    assert list(actual) == list(expected), "the optimized model's outputs differ from the original's"
    largest = 0.0
    for name, want in expected.items():
        got = actual[name]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"output {name}")
        if want.size:
            largest = max(largest, float(np.max(np.abs(got.astype(np.float64) - want))))
    return largest


def assert_fuses_as_pinned(model: onnx.ModelProto, feeds: dict[str, np.ndarray], fusions: dict[str, int],
                           level: str = "extended") -> None:
    """`optimize` at `level` makes exactly `fusions`, and the fused graph computes what `model` does,
    in onnxruntime and in our executor (onnxruntime on the unfused model is the oracle)."""
    import runtime  # here, not at the top: the optimizer's tests that never run a model stay light

    result = optimize(model, level)
    assert result.report.fusions == fusions
    assert_same_outputs(model, result, feeds)
    expected = run_onnxruntime(model, feeds)
    session = runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level=level))
    for (name, want), got in zip(expected.items(), session.run(None, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"our executor, output {name}")
