"""A reproduction model for a lost fusion: the region where it stood (structure.py), cut out as a model.

The cut keeps the region's nodes, the initializers and Constant nodes they read, and takes its
boundary values as typed, shaped graph inputs (shapes from ONNX shape inference of the whole model;
symbolic dimensions stay symbolic). A repro is only attached once the engine has been run on it:
this commit's must not produce the lost op, the baseline's must, and each must stay well under
MAX_REPRO_BYTES, so a person can attach both to an upstream bug report as they are.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from service.adapters.engines import ENGINES
from service.usecases.structure import Region

MAX_REPRO_BYTES = 256 * 1024


class ReproError(ValueError):
    """The region could not be cut out as a model that reproduces what the full model does."""


@dataclass(frozen=True)
class Repro:
    model: bytes
    fused: int  # nodes of the lost op the engine makes of it


def cut(model: onnx.ModelProto, region: Region, name: str) -> onnx.ModelProto:
    """`region` of `model` as a model of its own, with the model's opsets."""
    typed = _value_types(model)
    graph = model.graph
    read = {value for node in region.nodes for value in node.input if value}
    initializers = [init for init in graph.initializer if init.name in read]
    inputs = []
    for value in region.inputs:
        if value not in typed:
            raise ReproError(f"the type of '{value[:120]}' is unknown, so it cannot be an input of the repro")
        inputs.append(typed[value])
    output = typed.get(region.output)
    if output is None:
        # Shape inference stops at an op it does not know (a custom op): the region's result keeps its
        # data input's element type (an activation's does), its shape left for the engine to infer.
        if not inputs:
            raise ReproError(f"the type of '{region.output[:120]}' is unknown")
        output = helper.make_tensor_value_info(region.output, inputs[0].type.tensor_type.elem_type, None)
    cut_graph = helper.make_graph(region.nodes, name, inputs, [output], initializers)
    return helper.make_model(cut_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def verified(engine: str, model: onnx.ModelProto, level: str, op_key: str, expect_fused: bool,
             disabled: tuple[str, ...] = ()) -> Repro:
    """`model`'s bytes once `engine` at `level` (less `disabled` rules) was seen to make (or not make)
    `op_key` of it."""
    data = model.SerializeToString()
    if len(data) > MAX_REPRO_BYTES:
        raise ReproError(f"the cut is {len(data)} bytes, over the {MAX_REPRO_BYTES} a repro may have")
    with tempfile.TemporaryDirectory(prefix="fusionwatch-repro-") as folder:
        path = Path(folder) / "repro.onnx"
        path.write_bytes(data)
        optimized = ENGINES[engine].optimized_graph(path, level, disabled)
    fused = sum(1 for node in optimized.graph.node if _key(node) == op_key)
    if bool(fused) != expect_fused:
        raise ReproError(
            f"{engine} at {level} makes {fused} {op_key} of the cut, so it does not reproduce the "
            f"{'baseline' if expect_fused else 'commit'}'s model"
        )
    return Repro(data, fused)


def _key(node: onnx.NodeProto) -> str:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    return f"{domain}.{node.op_type}" if domain else node.op_type


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    graph = inferred.graph
    found = {v.name: v for v in (*graph.value_info, *graph.input, *graph.output)}
    return {name: value for name, value in found.items() if value.type.tensor_type.elem_type}


def command(engine: str, level: str, op: str, files: list[str]) -> str:
    """One line that shows the difference: the count of `op` the engine makes of each file."""
    op_type = op.rsplit(".", 1)[-1]
    names = " ".join(files)
    if engine == "onnxruntime":
        member = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED"}.get(level, "ORT_ENABLE_ALL")
        return (
            'python -c "import sys,onnx,onnxruntime as o;[(lambda s:(setattr(s,\'graph_optimization_level\','
            f'o.GraphOptimizationLevel.{member}),setattr(s,\'optimized_model_filepath\',f+\'.opt\'),'
            "o.InferenceSession(f,s,providers=['CPUExecutionProvider']),"
            f"print(f,sum(n.op_type=='{op_type}' for n in onnx.load(f+'.opt').graph.node))))(o.SessionOptions())"
            f' for f in sys.argv[1:]]" {names}'
        )
    return (f"for f in {names}; do fusionwatch optimize $f --level {level} --json | python -c \"import json,sys;"
            f"print('$f', json.load(sys.stdin)['ops_after'].get('{op}', 0))\"; done")
