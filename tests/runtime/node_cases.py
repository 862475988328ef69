"""ONNX's backend node test cases, run against single kernels without an executor.

`onnx.backend.test.case.node.collect_testcases` rebuilds every case of the ONNX conformance
suite in memory: a one-node model, its input and expected output arrays, and the tolerance
the case was written for. A kernel family's test picks the cases whose node op its `KERNELS`
claim at the case's opset, builds the registry's kernel for the node, and compares.

A kernel that raises UnsupportedOp has declined that node's variant; for an op the family
claims, that fails the case (runtime/conformance.py treats such models as not claimed).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from runtime.kernels import registry
from runtime.kernels.base import Kernel


@dataclass(frozen=True)
class NodeCase:
    name: str
    model: onnx.ModelProto
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    rtol: float
    atol: float

    def __repr__(self) -> str:  # keeps pytest ids and failure headers short
        return self.name


@functools.cache
def _all_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow on purpose (Cast, Reduce* on empty sets)
        return tuple(collect_testcases(None))


def _as_array(value) -> np.ndarray:
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


def _node_opset(model: onnx.ModelProto, domain: str) -> int:
    imports = {o.domain: o.version for o in model.opset_import}
    domain = "" if domain in ("", "ai.onnx") else domain
    return imports.get(domain, imports.get("ai.onnx", 1))


def node_cases(kernels: list[type[Kernel]]) -> Iterator[NodeCase]:
    """Every single-node case whose op one of `kernels` implements at the case's opset,
    one NodeCase per data set (suffixed `_1`, `_2`, … when a case has several)."""
    claimed: dict[tuple[str, str], list[int]] = {}
    for kernel in kernels:
        domain = "" if kernel.domain in ("", "ai.onnx") else kernel.domain
        claimed.setdefault((domain, kernel.op_type), []).append(kernel.since_version)
    for case in _all_cases():
        graph = case.model.graph
        if len(graph.node) != 1 or not case.data_sets:
            continue
        node = graph.node[0]
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        versions = claimed.get((domain, node.op_type))
        if not versions or min(versions) > _node_opset(case.model, domain):
            continue
        for index, (inputs, outputs) in enumerate(case.data_sets):
            suffix = f"_{index}" if len(case.data_sets) > 1 else ""
            yield NodeCase(
                name=case.name + suffix,
                model=case.model,
                inputs=[_as_array(v) for v in inputs],
                outputs=[_as_array(v) for v in outputs],
                rtol=case.rtol,
                atol=case.atol,
            )


def build_kernel(model: onnx.ModelProto) -> tuple[Kernel, ir.Node, ir.Graph]:
    """The registry's kernel for a one-node model's node (may raise UnsupportedOp)."""
    ir_model = ir.serde.deserialize_model(model)
    graph = ir_model.graph
    node = next(iter(graph))
    opset = _node_opset(model, node.domain)
    kernel_class = registry.find_kernel(node.domain, node.op_type, opset)
    if kernel_class is None:
        raise LookupError(
            f"registry has no kernel for {node.domain or 'ai.onnx'}::{node.op_type} at opset {opset}"
        )
    return kernel_class(node, opset), node, graph


def run_case(case: NodeCase) -> list[np.ndarray]:
    """Builds the node's kernel and runs it on the case's inputs; the node's outputs in order."""
    kernel, node, graph = build_kernel(case.model)
    by_name = {value.name: array for value, array in zip(graph.inputs, case.inputs, strict=False)}
    for name, value in graph.initializers.items():
        by_name.setdefault(name, value.const_value.numpy())
    arguments = [None if value is None else by_name[value.name] for value in node.inputs]
    while arguments and arguments[-1] is None:  # trailing omitted optionals take their defaults
        arguments.pop()
    results = kernel.run(*arguments)
    by_output = dict(zip((value.name for value in node.outputs), results, strict=False))
    return [by_output[value.name] for value in graph.outputs]


_EXOTIC_FLOATS = {
    np.dtype(t)
    for t in (
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
        ml_dtypes.float8_e8m0fnu,
        ml_dtypes.float4_e2m1fn,
    )
}
_EXOTIC_INTS = {np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)}


def assert_matches(name: str, actual, expected: np.ndarray, rtol: float, atol: float) -> None:
    """Same dtype and shape, then values: exact for integers, bools and strings; within the
    case's tolerance (NaN equal to NaN) for floats, via float32 for ml_dtypes' small floats."""
    assert isinstance(actual, np.ndarray), f"{name}: kernel returned {type(actual).__name__}, not ndarray"
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape}, expected {expected.shape}"
    if expected.dtype in _EXOTIC_FLOATS:
        np.testing.assert_allclose(
            actual.astype(np.float32), expected.astype(np.float32), rtol=rtol, atol=atol, equal_nan=True
        )
    elif expected.dtype in _EXOTIC_INTS:
        np.testing.assert_array_equal(actual.astype(np.int8), expected.astype(np.int8))
    elif expected.dtype.kind in "fc":
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def node_case_test(kernels: list[type[Kernel]]):
    """A test over every node case of `kernels`, one parametrized run each; a family's test
    module binds it as `test_node_case = node_case_test(family.KERNELS)`. A kernel that
    declines a case of an op it claims (UnsupportedOp) fails it: that is a gap, not a skip."""
    cases = list(node_cases(kernels))

    @pytest.mark.parametrize("case", cases, ids=[case.name for case in cases])
    def test_node_case(case):
        results = run_case(case)
        assert len(results) == len(case.outputs)
        for actual, expected in zip(results, case.outputs, strict=True):
            assert_matches(case.name, actual, expected, case.rtol, case.atol)

    return test_node_case


# ---- one-node models of our own, for variants the conformance suite no longer covers ----------


def one_node_model(
    op_type: str,
    inputs: list[np.ndarray | None],
    opset: int,
    outputs: int = 1,
    domain: str = "",
    **attributes,
) -> onnx.ModelProto:
    """A model of a single `op_type` node over graph inputs x0, x1, … (None: an omitted
    optional input) with outputs y0, y1, …; output types are left to inference. A node of
    another `domain` imports that domain at version 1 beside ONNX's `opset`."""
    names = [f"x{i}" if array is not None else "" for i, array in enumerate(inputs)]
    graph_inputs = [
        onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
        )
        for name, array in zip(names, inputs, strict=True)
        if array is not None
    ]
    output_names = [f"y{i}" for i in range(outputs)]
    node = onnx.helper.make_node(op_type, names, output_names, domain=domain or None, **attributes)
    graph = onnx.helper.make_graph(
        [node],
        op_type.lower(),
        graph_inputs,
        [onnx.helper.make_empty_tensor_value_info(n) for n in output_names],
    )
    imports = [onnx.helper.make_opsetid("", opset)]
    if domain:
        imports.append(onnx.helper.make_opsetid(domain, 1))
    model = onnx.helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return model


def run_kernel(model: onnx.ModelProto, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Our kernel's outputs for a model made by `one_node_model`."""
    present = [array for array in inputs if array is not None]
    return run_case(NodeCase(model.graph.name, model, present, [], 0.0, 0.0))


def run_onnxruntime(model: onnx.ModelProto, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """The oracle: onnxruntime with every graph optimization off, fed x0, x1, … in order."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    feeds = {f"x{i}": array for i, array in enumerate(inputs) if array is not None}
    return session.run(None, feeds)


def assert_same_output(actual, expected, rtol: float = 1e-3, atol: float = 1e-4) -> None:
    """One of our outputs against onnxruntime's: dtype and shape, then values within
    tolerance (fp32's by default) for floats, exactly for everything else; a sequence item by item."""
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same_output(a, e, rtol, atol)
        return
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"{actual.dtype}{list(actual.shape)} vs onnxruntime's {expected.dtype}{list(expected.shape)}"
    )
    if expected.dtype.kind == "f":
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(actual, expected)


def assert_same_as_onnxruntime(
    op_type: str,
    inputs: list[np.ndarray | None],
    opset: int,
    outputs: int = 1,
    rtol: float = 1e-3,
    atol: float = 1e-4,
    **attributes,
) -> None:
    """Our kernel and onnxruntime agree on every output of a one-node model (see
    `assert_same_output`); `rtol`/`atol` widen the fp32 tolerance where a test says why."""
    model = one_node_model(op_type, inputs, opset, outputs, **attributes)
    ours, theirs = run_kernel(model, inputs), run_onnxruntime(model, inputs)
    assert len(ours) == len(theirs)
    for actual, expected in zip(ours, theirs, strict=True):
        assert_same_output(actual, expected, rtol, atol)
