"""service/usecases/structure.py: where a lost fused op stood is found in this commit's graph by the
names the baseline's export used, or, when another exporter wrote it, by the parameter the fused op read."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from service.usecases import structure


def _bert_mlp(prefix: str, half_first: bool) -> onnx.ModelProto:
    """MatMul → Add(bias) → exact GELU → MatMul, names prefixed as an exporter would: the GELU as
    x·0.5·(1 + erf(x/√2)) (TorchScript's order), or 0.5·(1 + erf(x/√2))·x (`half_first`, the dynamo exporter's)."""
    p = prefix
    nodes = [helper.make_node("MatMul", ["x", "w1"], [f"{p}mm"], name=f"{p}MatMul"),
             helper.make_node("Add", [f"{p}mm", "fc.bias"], [f"{p}h"], name=f"{p}Add"),
             helper.make_node("Div", [f"{p}h", f"{p}sqrt2"], [f"{p}d"], name=f"{p}Div"),
             helper.make_node("Erf", [f"{p}d"], [f"{p}e"], name=f"{p}Erf"),
             helper.make_node("Add", [f"{p}e", f"{p}one"], [f"{p}e1"], name=f"{p}Add1")]
    if half_first:
        nodes += [helper.make_node("Mul", [f"{p}half", f"{p}e1"], [f"{p}m"], name=f"{p}MulHalf"),
                  helper.make_node("Mul", [f"{p}h", f"{p}m"], [f"{p}g"], name=f"{p}MulX")]
    else:
        nodes += [helper.make_node("Mul", [f"{p}h", f"{p}e1"], [f"{p}m"], name=f"{p}MulX"),
                  helper.make_node("Mul", [f"{p}m", f"{p}half"], [f"{p}g"], name=f"{p}MulHalf")]
    nodes.append(helper.make_node("MatMul", [f"{p}g", "w2"], ["y"], name=f"{p}MatMulOut"))
    scalars = {f"{p}sqrt2": np.sqrt(2), f"{p}one": 1.0, f"{p}half": 0.5}
    inits = [numpy_helper.from_array(np.full((4, 8), 0.1, np.float32), "w1"),
             numpy_helper.from_array(np.zeros(8, np.float32), "fc.bias"),
             numpy_helper.from_array(np.full((8, 4), 0.1, np.float32), "w2"),
             *(numpy_helper.from_array(np.array(v, np.float32), k) for k, v in scalars.items())]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _optimized_baseline() -> onnx.ModelProto:
    """The baseline as an engine optimized it: BiasGelu reading the MatMul's output and the bias."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["ts_mm"], name="ts_MatMul"),
             helper.make_node("BiasGelu", ["ts_mm", "fc.bias"], ["ts_g"], name="BiasGelu_0", domain="com.microsoft"),
             helper.make_node("MatMul", ["ts_g", "w2"], ["y"], name="ts_MatMulOut")]
    graph = helper.make_graph(nodes, "opt", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    return helper.make_model(graph)


def test_another_exporters_graph_is_found_by_the_bias_and_the_departure_named():
    [place] = structure.places_of(_optimized_baseline(), "com.microsoft.BiasGelu")
    assert (place.consumer, place.consumer_op) == ("ts_MatMulOut", "MatMul")
    before = structure.region_at(_bert_mlp("ts_", half_first=False), place)
    assert before.words == "Add → Div(√2) → Erf → Add(1) → Mul → Mul(0.5)"
    now = structure.region_at(_bert_mlp("dyn_", half_first=True), place)  # no value or node name in common
    assert now is not None and now.words == "Add → Div(√2) → Erf → Add(1) → Mul(0.5) → Mul"
    assert now.inputs == ["dyn_mm"] and now.output == "dyn_g"
    assert structure.departure(before, now) == "step 5: Mul(0.5) where the baseline had Mul"


def test_a_parameter_read_outside_a_closed_region_finds_no_place():
    [place] = structure.places_of(_optimized_baseline(), "com.microsoft.BiasGelu")
    model = _bert_mlp("dyn_", half_first=True)
    model.graph.node.insert(0, helper.make_node("Relu", ["x"], ["stray"], name="stray"))
    model.graph.node[5].input[1] = "stray"  # the GELU's Add(1) now reads a value from outside the region
    assert structure.region_at(model, place) is None
