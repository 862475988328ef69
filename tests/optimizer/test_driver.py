"""The driver's shared behaviour: levels, disabling, boundaries, near misses, hash, offline mode."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import LEVEL_NAMES, load_model, optimize


def mlp_model(*, gelu_domain: str = "com.microsoft", opset: int = 14, extra_outputs=(), bias_shape=(16,)):
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="/mlp/MatMul"),
        helper.make_node("Add", ["mm", "b"], ["a"], name="/mlp/Add"),
        helper.make_node("Gelu", ["a"], ["y"], name="/mlp/Gelu", domain=gelu_domain),
    ]
    rng = np.random.default_rng(0)
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])]
    outputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in extra_outputs]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        outputs,
        [
            numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(bias_shape).astype(np.float32), "b"),
        ],
    )
    imports = [helper.make_opsetid("", opset)]
    if gelu_domain:
        imports.append(helper.make_opsetid(gelu_domain, 1))
    return helper.make_model(graph, opset_imports=imports)


def test_disabled_level_changes_nothing():
    report = optimize(mlp_model(), level="disabled").report
    assert report.nodes_before == report.nodes_after == 3
    assert report.fusions == {} and report.rules == {}


@pytest.mark.parametrize("level", [name for name in LEVEL_NAMES if name not in ("disabled", "basic")])
def test_levels_from_extended_on_fuse_bias_gelu(level):
    report = optimize(mlp_model(), level=level).report
    assert report.fusions.get("com.microsoft.BiasGelu") == 1
    assert report.ops_after.get("com.microsoft.BiasGelu") == 1
    assert "Add" not in report.ops_after


def test_disabling_a_rule_by_onnxruntime_name():
    report = optimize(mlp_model(), level="all", disabled=["BiasGeluFusion"]).report
    assert "com.microsoft.BiasGelu" not in report.ops_after
    assert "BiasGeluFusion" not in report.rules
    assert report.disabled == ["BiasGeluFusion"]


def test_unknown_level_and_rule_names_are_named_in_the_error():
    with pytest.raises(ValueError, match="unknown optimization level 'fast'"):
        optimize(mlp_model(), level="fast")
    with pytest.raises(ValueError, match="NoSuchFusion"):
        optimize(mlp_model(), level="all", disabled=["NoSuchFusion"])


def test_intermediate_graph_output_blocks_the_fusion_and_says_why():
    # MatMulAddFusion would otherwise take the Add the Gelu could not; keep the pattern in view.
    report = optimize(mlp_model(extra_outputs=["a"]), level="extended", disabled=["MatMulAddFusion"]).report
    assert "com.microsoft.BiasGelu" not in report.ops_after
    [miss] = report.explain("BiasGeluFusion")
    assert miss.anchor == "/mlp/Gelu"
    assert miss.step == "boundary"
    assert miss.message == "BiasGeluFusion at /mlp/Gelu: intermediate value 'a' is a graph output"


def _runs_of_each_rule(monkeypatch, model, level: str) -> tuple[list[str], object]:
    import optimizer.driver as driver

    runs: list[str] = []
    apply_rule = driver.apply_rule

    def counting(rule, *args, **kwargs):
        runs.append(rule.name)
        return apply_rule(rule, *args, **kwargs)

    monkeypatch.setattr(driver, "apply_rule", counting)
    return runs, optimize(model, level=level).report


def test_a_rule_that_fired_nowhere_is_not_run_again_on_the_same_graph(monkeypatch):
    # Nothing fuses in a lone Relu: each rule runs once, though both phases and the settling
    # round go over the whole list, and the near misses of the one run are still reported.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="/relu")], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    )
    runs, report = _runs_of_each_rule(monkeypatch, helper.make_model(graph), "all")
    assert sorted(runs) == sorted(set(runs)) and len(runs) == len(report.rules)
    [miss] = report.explain("FuseReluClip")
    assert miss.anchor == "/relu"


def test_rules_run_again_after_a_rewrite_until_the_graph_settles(monkeypatch):
    # BiasGelu fires in the first round: the second round runs every rule before it and itself
    # again (the graph changed under them), not the ones after it, which already saw that graph.
    runs, report = _runs_of_each_rule(monkeypatch, mlp_model(), "extended")
    assert report.fusions == {"com.microsoft.BiasGelu": 1}
    order = list(report.rules)
    bias_gelu = order.index("BiasGeluFusion")
    assert runs.count("BiasGeluFusion") == 2
    assert all(runs.count(name) == 2 for name in order[:bias_gelu])
    assert all(runs.count(name) == 1 for name in order[bias_gelu + 1:])


def test_last_node_output_may_be_a_graph_output():
    model = optimize(mlp_model(), level="extended").model
    assert [v.name for v in model.graph.outputs] == ["y"]
    assert model.graph.outputs[0].producer().op_type == "BiasGelu"


def test_near_miss_names_the_rank_of_a_bad_bias():
    report = optimize(mlp_model(bias_shape=(2, 16)), level="extended", disabled=["MatMulAddFusion"]).report
    [miss] = report.explain("BiasGeluFusion")
    assert miss.step == "bias"
    assert miss.reason.startswith("bias 'b' has rank 2")


def test_graph_hash_ignores_weights_but_not_structure():
    a = optimize(mlp_model(), level="extended").report.graph_hash
    other_weights = mlp_model()
    other_weights.graph.initializer[0].CopyFrom(
        numpy_helper.from_array(np.ones((8, 16), np.float32), "w")
    )
    assert optimize(other_weights, level="extended").report.graph_hash == a
    assert optimize(mlp_model(), level="disabled").report.graph_hash != a


def test_graph_hash_of_a_graph_stays_what_stored_results_hold():
    # The service compares a result's hash with its baseline's, computed by an earlier version:
    # how the hash is computed may change, the value for a graph may not.
    assert optimize(mlp_model(), level="extended").report.graph_hash == "4116f31e902aa295"
    assert optimize(mlp_model(), level="disabled").report.graph_hash == "6a5821673a1eac70"


def test_offline_mode_writes_a_model_that_loads_at_level_disabled(tmp_path):
    path = tmp_path / "opt.onnx"
    fused = optimize(mlp_model(), level="all", output=path)
    onnx.checker.check_model(onnx.load(path))
    again = optimize(path, level="disabled")
    assert again.report.ops_after == fused.report.ops_after
    assert again.report.graph_hash == fused.report.graph_hash


def test_ir_model_is_optimized_in_place():
    model = load_model(mlp_model())
    result = optimize(model, level="extended")
    assert result.model is model
    assert isinstance(model, ir.Model)


def test_graph_with_a_type_attribute_optimizes():
    """Optional's `type` attribute is unhashable; the basic level must still run."""
    optional = helper.make_node(
        "Optional", [], ["opt"], type=helper.make_tensor_type_proto(TensorProto.FLOAT, [2])
    )
    has = helper.make_node("OptionalHasElement", ["opt"], ["has"])
    graph = helper.make_graph([optional, has], "g", [], [helper.make_tensor_value_info("has", TensorProto.BOOL, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    report = optimize(model, level="basic").report
    assert report.ops_after == {"Optional": 1, "OptionalHasElement": 1}


def test_custom_op_inside_a_pattern_is_reported_as_a_fusion_barrier():
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="/mlp/Add"),
        helper.make_node("Scale", ["a"], ["s"], name="/mlp/Scale", domain="my.ops"),
        helper.make_node("Gelu", ["s"], ["y"], name="/mlp/Gelu", domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        [numpy_helper.from_array(np.ones(16, np.float32), "b")],
    )
    imports = [helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("my.ops", 1)]
    result = optimize(helper.make_model(graph, opset_imports=imports), level="all")
    assert result.report.ops_after == {"Add": 1, "com.microsoft.Gelu": 1, "my.ops.Scale": 1}  # passed through untouched
    [miss] = result.report.explain("BiasGeluFusion")
    assert miss.barrier == "my.ops.Scale"
    assert miss.reason == (
        "input of com.microsoft.Gelu '/mlp/Gelu' comes from my.ops.Scale '/mlp/Scale' "
        "(custom op, a fusion barrier), not Add"
    )


def test_a_dead_chain_goes_whole_when_the_model_lists_its_nodes_out_of_order():
    # ONNX Runtime's embed_layer_norm_format8.onnx lists a Shape -> Gather after the Range reading
    # it; the unused-node sweep runs from the back, so it has to see the graph sorted first.
    nodes = [
        helper.make_node("Range", ["start", "length", "step"], ["positions"], name="/Range"),
        helper.make_node("Relu", ["x"], ["y"], name="/Relu"),
        helper.make_node("Shape", ["x"], ["shape"], name="/Shape"),
        helper.make_node("Gather", ["shape", "one"], ["length"], name="/Gather", axis=0),
    ]
    scalars = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("start", 0), ("step", 1), ("one", 1))]
    graph = helper.make_graph(nodes, "unsorted", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s"])], scalars)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert optimize(model, "basic").report.ops_after == {"Relu": 1}
