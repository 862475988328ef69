"""CommonSubexpressionElimination: nodes computing the same op on the same inputs become one.

TorchScript exports repeat `Shape(x)` and friends for every use; merging them lets the
pattern rules see one producer where there were several. onnx-ir's CommonSubexpressionEliminationPass
decides what merges (same op, domain, overload, output count, inputs and attributes; nodes with
subgraphs, tensor attributes above SIZE_LIMIT elements or random ops are left alone), and this rule
merges exactly what it would, in the same order, keeping the same node.

It is written here rather than called because the pass builds every node's full key, attributes
read and sorted, to find the few nodes that merge: ~3.5 µs a node, 2.4 ms of a tiny GPT-2's
optimize over four runs. Here a node's op and inputs come first and its attributes are read only
when another node shares them, which in most graphs is a handful of nodes
(test_common_subexpression_elimination.py holds it to onnx-ir's pass).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from optimizer.rule import Fail, Rule

SIZE_LIMIT = 10  # onnx-ir's default: larger tensor attributes (weights) are not compared
NONDETERMINISTIC = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial"})


class CommonSubexpressionElimination(Rule):
    name = "CommonSubexpressionElimination"

    def run_on_graph(self, graph: ir.Graph, near_misses: list[tuple[ir.Node, Fail]]) -> int:
        if _has_type_attribute(graph):
            # onnx-ir's pass hashes attributes, and type attributes (Optional's `type`) are not
            # hashable; such graphs are rare (optional values), so they go without merging.
            return 0
        before = graph.num_nodes()
        eliminate_common_subexpressions(graph)
        return before - graph.num_nodes()


_SKIPPED = object()  # an attribute key for a node the pass leaves alone


def eliminate_common_subexpressions(graph: ir.Graph) -> None:
    """onnx-ir's pass on `graph`: each node that repeats an earlier kept node's key is removed and
    its readers read the earlier node's outputs.

    The key is split: op, output count and input identities (cheap) index the kept nodes, each with
    its attribute key, read on the first comparison that needs it. The pass registers a node under
    its full key unless it is skipped; a skipped node found here on reading its attributes is
    dropped from its list, so the lists hold what the pass's table holds, in the same order."""
    kept: dict[tuple, list[list]] = {}
    for node in graph:  # onnx-ir's list allows removing the current node while walking
        if node.op_type in NONDETERMINISTIC and node.domain == "":
            continue
        key = (node.domain, node.op_type, node.overload, len(node.outputs), *[id(v) for v in node.inputs])
        entries = kept.get(key)
        if entries is None:
            kept[key] = [[node, None]]
            continue
        attributes = _attribute_key(node)
        if attributes is _SKIPPED:
            continue
        for entry in list(entries):
            if entry[1] is None:
                entry[1] = _attribute_key(entry[0])
            if entry[1] is _SKIPPED:
                entries.remove(entry)
            elif entry[1] == attributes:
                _remove_node_and_replace_values(graph, node, node.outputs, entry[0].outputs)
                break
        else:
            entries.append([node, attributes])


def _attribute_key(node: ir.Node):
    """The attributes as onnx-ir's pass compares them (sorted name, value pairs, lists as tuples,
    small tensors as shape, dtype and bytes); _SKIPPED for a node with a subgraph or a larger tensor."""
    attributes = {}
    for name, attribute in node.attributes.items():
        kind = attribute.type
        if kind in _GRAPH_ATTRIBUTES:
            return _SKIPPED
        value = attribute.value
        if kind in _LIST_ATTRIBUTES:
            value = tuple(value)
        elif kind is ir.AttributeType.TENSOR:
            if value.size > SIZE_LIMIT:
                return _SKIPPED
            array = value.numpy()
            value = (array.shape, str(array.dtype), array.tobytes())
        attributes[name] = value
    return tuple(sorted(attributes.items()))


def _remove_node_and_replace_values(
    graph: ir.Graph, remove_node: ir.Node, remove_values: Sequence[ir.Value], new_values: Sequence[ir.Value]
) -> None:
    """onnx-ir's own step for a merge: a removed graph output keeps its name (on the kept value, or
    through an Identity where the kept value is a graph input or output itself)."""
    if any(value.is_graph_output() for value in remove_values):
        replacement = dict(zip(remove_values, new_values, strict=True))
        for index, output in enumerate(graph.outputs):
            if output not in replacement:
                continue
            new_value = replacement[output]
            if new_value.is_graph_output() or new_value.is_graph_input():
                identity = ir.node(
                    "Identity", inputs=[new_value],
                    outputs=[ir.Value(name=output.name, type=output.type, shape=output.shape)],
                )
                graph.outputs[index] = identity.outputs[0]
                graph.insert_before(remove_node, identity)
            else:
                new_value.name = output.name
                graph.outputs[index] = new_value
    ir.convenience.replace_all_uses_with(remove_values, new_values)
    graph.remove(remove_node, safe=True)


def _has_type_attribute(graph: ir.Graph) -> bool:
    # Plain loops over nodes that have attributes: a generator per node cost a quarter of this
    # rule on a tiny GPT-2 (three runs over ~300 nodes).
    for node in graph:
        attributes = node.attributes
        if attributes:
            for attribute in attributes.values():
                if attribute.type in _TYPE_ATTRIBUTES:
                    return True
    return False


_TYPE_ATTRIBUTES = (ir.AttributeType.TYPE_PROTO, ir.AttributeType.TYPE_PROTOS)
_GRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
_LIST_ATTRIBUTES = (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS)
