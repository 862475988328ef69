"""SkipLayerNormFusion: residual Add [+ bias Add] -> LayerNormalization => com.microsoft.SkipLayerNormalization.

The RMS norm comes in two forms, ONNX Runtime's SimplifiedLayerNormalization (what our
SimplifiedLayerNormFusion emits) and the standard RMSNormalization of opset 23 (what PyTorch's
dynamo exporter writes for Llama-style models); after a residual Add either one becomes
com.microsoft.SkipSimplifiedLayerNormalization, which takes no beta.

    LayerNormalization(Add(x, skip))                 => SkipLayerNormalization(x, skip, gamma, beta)
    LayerNormalization(Add(Add(x, bias), skip))      => SkipLayerNormalization(x, skip, gamma, beta, bias)
    LayerNormalization(Add(x, Add(skip, bias)))      => SkipLayerNormalization(x, skip, gamma, beta, bias)

In a transformer the residual sum also feeds the next residual Add. ONNX Runtime's C++
fusion then gives up (it wants the Add read only by the LayerNormalization); its Python
fusion keeps the sum as SkipLayerNormalization's fourth output, input_skip_bias_sum, and so
do we: on BERT that is the difference between fusing every encoder LayerNorm and none.

Mixed precision: a LayerNormalization of float16 data with float32 gamma (what LayerNormFusion
makes of a float16 residual stream normalized in float32) gives float32, and
SkipLayerNormalization takes one type throughout, so its float16 inputs are cast to float32 in
front of it, as ONNX Runtime's fusion does: the residual sum is then taken in float32, which
the chain rounded to float16 first (tests/optimizer/test_ort_fusion_cases.py bounds the
difference). That sum is float32 too, so when something else reads the float16 sum the fusion
is a near miss.

As in ONNX Runtime, both residual inputs must be rank 3 with the same shape (the kernel does
not broadcast) and the bias 1-D with the hidden size. Unlike it, a LayerNormalization over
any axis but the last is refused (SkipLayerNormalization only normalizes the last one), and
an absent epsilon becomes LayerNormalization's default 1e-5 rather than SkipLayerNorm's 1e-12.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import (
    MS,
    attr,
    const_array,
    custom_ancestor,
    describe,
    is_op,
    producer,
    rank,
    static_shape,
    value_name,
)
from optimizer.rule import Match, Rule, fail
from optimizer.shape_probe import pinned_shapes

FUSABLE_DTYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)
LAYER_NORM_DEFAULT_EPSILON = 1e-5


class SkipLayerNormFusion(Rule):
    name = "SkipLayerNormFusion"
    anchors = ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization")
    emits = ("com.microsoft.SkipLayerNormalization", "com.microsoft.SkipSimplifiedLayerNormalization")

    def match(self, graph: ir.Graph, ln: ir.Node):
        simplified = not is_op(ln, "LayerNormalization")
        fused = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
        add = producer(ln.inputs[0])
        if not is_op(add, "Add"):
            return fail("residual", f"input of {describe(ln)} comes from {describe(add)}, not a residual Add", add)
        if any(output.uses() or output.is_graph_output() for output in ln.outputs[1:]):
            return fail("layernorm", f"{describe(ln)} also returns its Mean/InvStdDev, which {fused} does not")
        x_rank = rank(ln.inputs[0])
        axis = int(attr(ln, "axis", -1))
        if axis != -1 and not (x_rank is not None and axis == x_rank - 1):
            return fail("layernorm", f"{describe(ln)} normalizes from axis {axis}; {fused} normalizes the last axis only")
        gamma = ln.inputs[1]
        beta = ln.inputs[2] if len(ln.inputs) > 2 and not simplified else None
        for role, weight in (("gamma", gamma), ("beta", beta)):
            if weight is not None and (static_shape(weight) is None or len(static_shape(weight)) != 1):
                return fail("layernorm", f"{role} '{value_name(weight)}' of {describe(ln)} is not 1-D")
        dtype = ln.inputs[0].dtype
        if dtype is not None and dtype not in FUSABLE_DTYPES:
            return fail("dtype", f"input of {describe(ln)} is {dtype.name.lower()}; {fused} takes float or float16")
        widen = dtype is not None and gamma.dtype is not None and dtype != gamma.dtype
        if widen and (dtype, gamma.dtype) != (ir.DataType.FLOAT16, ir.DataType.FLOAT):
            return fail("dtype", f"{describe(ln)} takes {dtype.name.lower()} input and {gamma.dtype.name.lower()} "
                        f"gamma; {fused} takes one type, and only float16 input is cast up to float gamma")

        failure = _check_residual(graph, add, fused)
        if failure:
            return failure
        x, skip = add.inputs[0], add.inputs[1]
        nodes = [add, ln]
        bias = None
        for side in (0, 1):  # a bias Add on either residual input (ONNX Runtime's formats 1 and 2)
            split = _split_bias(add.inputs[side])
            if split is not None:
                bias_add, unbiased, bias = split
                nodes.insert(0, bias_add)
                if side == 0:
                    x = unbiased
                else:
                    skip = unbiased
                break

        outputs = [ln.outputs[0]]
        residual = add.outputs[0]
        keep_sum = residual.is_graph_output() or any(user is not ln for user, _ in residual.uses())
        if keep_sum and widen:
            return fail("residual", f"the float16 residual sum '{value_name(residual)}' of {describe(add)} has other "
                        f"readers, but {fused} on float32 gamma would give it as float32")
        if keep_sum:
            outputs.append(residual)
        return Match(
            nodes=nodes,
            outputs=outputs,
            captures={
                "op_type": fused,
                "inputs": [x, skip, gamma, bias] if simplified else [x, skip, gamma, beta, bias],
                "epsilon": float(attr(ln, "epsilon", LAYER_NORM_DEFAULT_EPSILON)),
                "keep_sum": keep_sum,
                "widen": widen,
            },
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        inputs = list(match.inputs)
        if match.widen:  # x, skip and bias in float32, gamma's type; beta already is
            inputs = [_to_float(op, v) if i in (0, 1, len(inputs) - 1) else v for i, v in enumerate(inputs)]
        while inputs[-1] is None:  # optional trailing inputs are left out, not passed empty
            inputs.pop()
        if not match.keep_sum:
            return op.op(match.op_type, inputs, attributes={"epsilon": match.epsilon}, domain=MS)
        # outputs: output, mean, inv_std_var, input_skip_bias_sum; the middle two stay empty
        outputs = [ir.Value(), ir.Value(name=""), ir.Value(name=""), ir.Value()]
        op.op_multi_out(match.op_type, inputs, attributes={"epsilon": match.epsilon}, domain=MS, outputs=outputs)
        return [outputs[0], outputs[3]]


def _to_float(op: ir.tape.Tape, value: ir.Value | None) -> ir.Value | None:
    if value is None or value.dtype != ir.DataType.FLOAT16:
        return value
    cast = op.op("Cast", [value], attributes={"to": int(ir.DataType.FLOAT)})
    cast.dtype = ir.DataType.FLOAT
    cast.shape = None if value.shape is None else ir.Shape(list(value.shape))
    return cast


def _check_residual(graph: ir.Graph, add: ir.Node, fused: str):
    """Both residual inputs rank 3 with equal shapes: ONNX Runtime's SkipLayerNorm kernel doesn't broadcast."""
    shapes = []
    for value in add.inputs:
        value_rank = rank(value)
        if value_rank != 3:
            shown = "unknown rank" if value_rank is None else f"rank-{value_rank}"
            barrier = custom_ancestor(value)
            why = (f" (shapes are lost at custom op {describe(barrier)}, which shape inference cannot see "
                   "through; the model's value_info can declare its output's shape)"
                   ) if value_rank is None and barrier is not None else ""
            return fail("residual", f"residual {describe(add)} has {shown} input '{value_name(value)}'{why}; "
                        f"{fused} needs rank 3 (batch, sequence, hidden)", barrier)
        shapes.append(value.shape if value.shape is not None else static_shape(value))
    if all(str(a) == str(b) and a is not None for a, b in zip(shapes[0], shapes[1], strict=True)):
        return None
    # Differently named dimensions may differ at run time (one may be 1), so, as in ONNX Runtime,
    # each dimension must be the same number or the same name, or, where an export names one size
    # twice (TorchScript's GPT-2: the batch of the attention output and of the embeddings), be the
    # same number in the graph inferred at two sets of input sizes (shape_probe).
    first, second = pinned_shapes(graph, add.inputs[0])
    pinned = [(first.get(v.name), second.get(v.name)) for v in add.inputs]
    if None not in pinned[0] + pinned[1] and pinned[0] == pinned[1]:
        return None
    return fail("residual", f"inputs of residual {describe(add)} have shapes {_dims(shapes[0])} and "
                f"{_dims(shapes[1])}; {fused} does not broadcast")


def _split_bias(value: ir.Value):
    """(bias Add, the other input, bias) when `value` = Add(t, bias) with a constant 1-D bias of t's last dimension."""
    bias_add = producer(value)
    if not is_op(bias_add, "Add") or value.is_graph_output() or len(value.uses()) != 1:
        return None  # a biased value read elsewhere too must stay; the bias Add is then left out
    for data, bias in ((bias_add.inputs[0], bias_add.inputs[1]), (bias_add.inputs[1], bias_add.inputs[0])):
        shape = static_shape(bias)
        if const_array(bias) is None or shape is None or len(shape) != 1 or rank(data) != 3:
            continue
        hidden = data.shape[-1] if data.shape is not None else None
        if isinstance(hidden, int) and hidden == shape[0]:
            return bias_add, data, bias
    return None


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
