"""Rules keep nothing between calls: levels.py creates each rule once and every optimization in the
process shares it, so two models optimized at once must not see each other's near misses."""

from __future__ import annotations

import threading

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from optimizer import optimize
from optimizer.levels import LEVELS


def _model(tag: str):
    """x + Gather(table, index out of range): ConstantFolding cannot evaluate the Gather and says so
    at node '/<tag>/gather'; the rest of the graph is a LayerNorm pattern so other rules work too."""
    table = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), f"{tag}_table")
    index = numpy_helper.from_array(np.array([7], np.int64), f"{tag}_index")
    nodes = [
        helper.make_node("Gather", [f"{tag}_table", f"{tag}_index"], ["row"], name=f"/{tag}/gather"),
        helper.make_node("Add", ["x", "row"], ["y"], name=f"/{tag}/add"),
        helper.make_node("ReduceMean", ["y"], ["mean"], name=f"/{tag}/mean", axes=[-1]),
        helper.make_node("Sub", ["y", "mean"], ["z"], name=f"/{tag}/sub"),
    ]
    graph = helper.make_graph(nodes, tag, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [table, index])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _folding_misses(report) -> set[str]:
    return {m.anchor for m in report.near_misses if m.rule == "ConstantFolding"}


def test_an_optimization_leaves_every_rule_object_as_it_was():
    rules = {id(rule): rule for rules in LEVELS.values() for rule in rules}.values()
    before = {id(rule): dict(vars(rule)) for rule in rules}
    report = optimize(_model("a"), "all").report
    assert _folding_misses(report) == {"/a/gather"}
    assert {id(rule): dict(vars(rule)) for rule in rules} == before


def test_two_models_optimized_at_once_keep_their_own_near_misses():
    rounds = 20
    barrier = threading.Barrier(2)
    found: dict[str, list[set[str]]] = {"a": [], "b": []}

    def work(tag: str) -> None:
        for _ in range(rounds):
            barrier.wait()
            found[tag].append(_folding_misses(optimize(_model(tag), "basic").report))

    threads = [threading.Thread(target=work, args=(tag,)) for tag in found]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found["a"] == [{"/a/gather"}] * rounds
    assert found["b"] == [{"/b/gather"}] * rounds
