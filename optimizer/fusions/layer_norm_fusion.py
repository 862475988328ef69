"""LayerNormFusion: the exported LayerNorm subgraph => LayerNormalization(x, gamma, beta).

    mean = ReduceMean(x)                     d = Sub(x, mean)
    var  = ReduceMean(Pow(d, 2) | Mul(d, d))
    std  = Sqrt(Add(var, eps))
    y    = Div(d, std) | Mul(d, Reciprocal(std))
    out  = Add(Mul(y, gamma), beta)          => LayerNormalization(x, gamma, beta, axis=-1, epsilon=eps)

Variants ONNX Runtime's layer_norm_fusion.cc accepts are accepted here too: two copies of
the Sub (older PyTorch), a Cast between Sub and Pow or between the normalization and the
gamma Mul, the exponent 2 arriving through a Cast, and ReduceMean axes as an attribute
(opset < 18) or a constant input (opset >= 18).

Mixed precision (Apex O2, float16 exports): the Casts between float16 and float32 that run
part of the pattern in the other precision are absorbed, the Cast feeding the pattern's input
and those inside it, as ONNX Runtime does. The fused op computes its statistics in float32
whatever X's type (stash_type 1), so it is at least as precise as the chain it replaces, and
its output takes gamma's type, which is the chain's output type. Where X and gamma then differ
in type, that needs ONNX Runtime's since-1 LayerNormalization (opset < 17, its T and V types);
from opset 17 the op takes one type throughout, so there it is a near miss. Other Casts
(double, integers) are near misses, and Casts behind the pattern stay. ONNX Runtime skips the
float16 fusions on its CPU provider only because its older CPU kernels had no float16 path;
ours has one (runtime/kernels/normalization.py).

The fused op is the ONNX-domain LayerNormalization for every opset: standard from opset 17,
and below that ONNX Runtime's own since-1 registration of the same name in the ONNX domain,
which is what ONNX Runtime emits there and what it runs. Unlike ONNX Runtime, which falls back
to epsilon 1e-5 when the Add's constant can't be read and never checks the exponent, a
non-constant epsilon or an exponent other than 2 is a near miss here, since fusing would change
the numbers.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import (
    attr,
    const_array,
    consumers,
    describe,
    input_at,
    is_const_close,
    is_op,
    other_input,
    producer,
    rank,
    sole_consumer,
    static_shape,
    value_name,
)
from optimizer.rule import Fail, Match, Rule, fail

FUSABLE_DTYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)
# The precisions a Cast inside (or feeding) the pattern may switch between: the fused op
# computes in float32 either way, so dropping such a Cast never loses precision.
MIXED_DTYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)
# ONNX Runtime's since-1 LayerNormalization types X apart from Scale/B/Y; the standard one (17) does not.
ONE_TYPE_OPSET = 17


class LayerNormFusion(Rule):
    name = "LayerNormFusion"
    anchors = ("ReduceMean",)
    emits = ("LayerNormalization",)

    def match(self, graph: ir.Graph, mean_node: ir.Node):
        x, mean = mean_node.inputs[0], mean_node.outputs[0]
        subs = consumers(mean)
        # The mean of a LayerNorm feeds only Subs; any other ReduceMean is not a candidate.
        if not subs or not all(is_op(s, "Sub") for s in subs):
            centering = _centering_mean(x)
            if centering is not None:  # the second ReduceMean of a LayerNorm: its answer is at the first
                return fail("variance", f"{describe(mean_node)} is the variance of the LayerNorm centered by "
                            f"{describe(centering)}; that ReduceMean's near miss says why it did not fuse")
            return fail("mean", f"{describe(mean_node)} feeds {_readers(mean)}, not the Sub that centers a LayerNorm's input")
        if len(subs) > 2:
            return fail("sub", f"the mean feeds {len(subs)} Subs; a LayerNorm has one (or two in older exports)")
        for sub in subs:
            if sub.inputs[1] is not mean or sub.inputs[0] is not x:
                return fail(
                    "sub",
                    f"{describe(sub)} computes '{value_name(sub.inputs[0])}' - '{value_name(sub.inputs[1])}', "
                    f"not the ReduceMean's input '{value_name(x)}' minus the mean",
                    sub,
                )
        failure = check_float_input(x, "LayerNormalization", FUSABLE_DTYPES)
        if failure:
            return failure

        nodes: list[ir.Node] = [mean_node, *subs]
        source = x
        lead = _leading_cast(x, [mean_node, *subs])
        if lead is not None:
            source = lead.inputs[0]
            nodes.insert(0, lead)

        # Every value that carries d = x - mean: the Sub outputs and float16/float32 Casts of them.
        centered = [s.outputs[0] for s in subs]
        for value in list(centered):
            cast = reader(value, "Cast")
            if cast is not None:
                if not switches_precision(cast):
                    return cast_fail(cast, _PRECISION_ONLY)
                centered.append(cast.outputs[0])
                nodes.append(cast)

        square = _find_square(centered)
        if isinstance(square, Fail):
            return square
        if square is None:
            return fail("square", f"no Pow(d, 2) or Mul(d, d) reads the centered value '{value_name(centered[0])}'")
        square_node, square_extra = square
        nodes += [square_node, *square_extra]

        variance = variance_chain(square_node, "LayerNormalization")
        if isinstance(variance, Fail):
            return variance
        var_node, eps_node, sqrt_node, epsilon = variance
        nodes += [var_node, eps_node, sqrt_node]

        scaled = normalize_step(sqrt_node, centered)
        if isinstance(scaled, Fail):
            return scaled
        normalized, scale_nodes = scaled
        nodes += scale_nodes

        axes = check_axes(mean_node, var_node, x)
        if isinstance(axes, Fail):
            return axes

        tail = affine_tail(normalized, x, with_beta=True, axes=axes, cast_ok=switches_precision)
        if isinstance(tail, Fail):
            return tail
        gamma, beta, tail_nodes = tail
        nodes += tail_nodes
        failure = _check_types(graph, source, gamma)
        if failure:
            return failure
        return Match(
            nodes=nodes,
            outputs=[tail_nodes[-1].outputs[0]],
            captures={"x": source, "gamma": gamma, "beta": beta, "epsilon": epsilon, "axis": -axes,
                      "double": x.dtype == ir.DataType.DOUBLE},
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        attributes = {"axis": match.axis, "epsilon": match.epsilon}
        if match.double:  # ONNX Runtime computes double LayerNorm in double
            attributes["stash_type"] = int(ir.DataType.DOUBLE)
        return op.op("LayerNormalization", [match.x, match.gamma, match.beta], attributes=attributes)


def switches_precision(cast: ir.Node) -> bool:
    """A Cast that keeps the dtype or switches between float16 and float32."""
    source = cast.inputs[0].dtype if cast.inputs[0] is not None else None
    return keeps_dtype(cast) or (source in MIXED_DTYPES and int(attr(cast, "to", -1)) in MIXED_DTYPES)


def _leading_cast(x: ir.Value, pattern: list[ir.Node]) -> ir.Node | None:
    """The Cast producing `x` from float16 or float32 data in the other precision, when only the
    pattern reads its output (ONNX Runtime's Apex O2 form): the fused op reads its input instead."""
    cast = producer(x)
    if not is_op(cast, "Cast") or keeps_dtype(cast) or not switches_precision(cast) or x.is_graph_output():
        return None
    return cast if all(user in pattern for user, _ in x.uses()) else None


def _check_types(graph: ir.Graph, x: ir.Value, gamma: ir.Value) -> Fail | None:
    """X and gamma of different types need ONNX Runtime's since-1 LayerNormalization (opset < 17)."""
    if x.dtype is None or gamma.dtype is None or x.dtype == gamma.dtype:
        return None
    opset = graph.opset_imports.get("", 1)
    if opset >= ONE_TYPE_OPSET:
        return fail("dtype", f"input '{value_name(x)}' is {_dtype_name(x.dtype)} but gamma '{value_name(gamma)}' is "
                    f"{_dtype_name(gamma.dtype)}; LayerNormalization takes one type throughout from opset "
                    f"{ONE_TYPE_OPSET} (this model imports {opset})")
    return None


# --- steps shared with SimplifiedLayerNormFusion ------------------------------------------


def keeps_dtype(cast: ir.Node) -> bool:
    source = cast.inputs[0].dtype if cast.inputs[0] is not None else None
    return source is not None and int(attr(cast, "to", -1)) == int(source)


def cast_fail(cast: ir.Node, why: str = "the fused op would change the output dtype") -> Fail:
    source = cast.inputs[0].dtype
    target = ir.DataType(int(attr(cast, "to", 0)))
    return fail(
        "cast",
        f"{describe(cast)} inside the pattern changes dtype from {_dtype_name(source)} to {_dtype_name(target)}; {why}",
        cast,
    )


_PRECISION_ONLY = "only Casts between float16 and float are absorbed, since the fused op computes in float"


def check_float_input(x: ir.Value, fused_op: str, dtypes: tuple[ir.DataType, ...]) -> Fail | None:
    if x.dtype is not None and x.dtype not in dtypes:
        names = " and ".join(_dtype_name(d) for d in dtypes)
        return fail("dtype", f"input '{value_name(x)}' is {_dtype_name(x.dtype)}; {fused_op} is fused for {names} only")
    return None


def _find_square(centered: list[ir.Value]):
    """The Pow(d, 2) or Mul(d, d) reading one of the centered values, with a Cast feeding the exponent."""
    for value in centered:
        for node in consumers(value):
            if is_op(node, "Mul") and node.inputs[0] is value and node.inputs[1] is value:
                return node, []
            if is_op(node, "Pow") and node.inputs[0] is value:
                return square_exponent(node)
    return None


def square_exponent(pow_node: ir.Node):
    """(pow_node, [exponent Cast]) when the exponent is the constant 2, else a near miss."""
    exponent = pow_node.inputs[1]
    extra: list[ir.Node] = []
    cast = producer(exponent)
    if is_op(cast, "Cast") and sole_consumer(exponent) is pow_node:
        extra, exponent = [cast], cast.inputs[0]
    value = const_array(exponent)
    if value is None:
        return fail("square", f"exponent '{value_name(pow_node.inputs[1])}' of {describe(pow_node)} is not a constant")
    if value.size != 1 or float(value.reshape(-1)[0]) != 2.0:
        shown = value.reshape(-1)[0] if value.size == 1 else f"a tensor of shape {list(value.shape)}"
        return fail("square", f"{describe(pow_node)} raises to {shown}, not 2")
    return pow_node, extra


def variance_chain(square_node: ir.Node, fused_op: str):
    """square -> ReduceMean -> Add(eps) -> Sqrt: returns (ReduceMean, Add, Sqrt, epsilon) or a near miss."""
    var_node = reader(square_node.outputs[0], "ReduceMean")
    if var_node is None:
        return fail("variance", f"{describe(square_node)} feeds {_readers(square_node.outputs[0])}, not one ReduceMean")
    eps_node = reader(var_node.outputs[0], "Add")
    if eps_node is None:
        return fail("epsilon", f"the variance {describe(var_node)} feeds {_readers(var_node.outputs[0])}, not Add(epsilon)")
    eps_value = other_input(eps_node, var_node.outputs[0])
    eps_array = const_array(eps_value)
    if eps_array is None:
        return fail("epsilon", f"epsilon input '{value_name(eps_value)}' of {describe(eps_node)} is not a constant")
    if eps_array.size != 1:
        return fail("epsilon", f"epsilon '{value_name(eps_value)}' has {eps_array.size} elements, not one")
    epsilon = float(eps_array.reshape(-1)[0])
    if not np.isfinite(epsilon) or epsilon < 0:
        return fail("epsilon", f"epsilon '{value_name(eps_value)}' is {epsilon}; {fused_op} needs a non-negative epsilon")
    sqrt_node = reader(eps_node.outputs[0], "Sqrt")
    if sqrt_node is None:
        return fail("sqrt", f"{describe(eps_node)} feeds {_readers(eps_node.outputs[0])}, not Sqrt")
    return var_node, eps_node, sqrt_node, epsilon


def normalize_step(sqrt_node: ir.Node, centered: list[ir.Value]):
    """Div(d, std) or Mul(d, 1 / std) with d one of `centered`: (normalized value, nodes).

    1 / std is Reciprocal(std) or, as TorchScript exports torch.rsqrt, Div(1, std)."""
    std = sqrt_node.outputs[0]
    user = reader(std, "Div", "Reciprocal")
    inverts = is_op(user, "Reciprocal") or (
        is_op(user, "Div") and user.inputs[1] is std and is_const_close(user.inputs[0], 1.0, rtol=0.0)
    )
    if inverts:
        mul = reader(user.outputs[0], "Mul")
        if mul is None or other_input(mul, user.outputs[0]) not in centered:
            return fail(
                "divide",
                f"1 / the standard deviation ({describe(user)}) feeds {_readers(user.outputs[0])}, "
                f"not Mul with '{value_name(centered[0])}'",
            )
        return mul.outputs[0], [user, mul]
    if is_op(user, "Div"):
        if user.inputs[1] is not std or user.inputs[0] not in centered:
            return fail(
                "divide",
                f"{describe(user)} divides '{value_name(user.inputs[0])}' by '{value_name(user.inputs[1])}', "
                f"not '{value_name(centered[0])}' by the standard deviation",
                user,
            )
        return user.outputs[0], [user]
    return fail("divide", f"the standard deviation {describe(sqrt_node)} feeds {_readers(std)}, not Div or Reciprocal")


def reduce_mean_axes(node: ir.Node) -> list[int] | None:
    """A ReduceMean's axes: the attribute before opset 18, the constant second input from 18 on."""
    if "axes" in node.attributes:
        return [int(a) for a in attr(node, "axes")]
    axes = input_at(node, 1)
    if axes is None:
        return []  # no axes: every axis is reduced
    array = const_array(axes)
    return None if array is None else [int(a) for a in array.reshape(-1)]


def check_axes(first: ir.Node, second: ir.Node | None, x: ir.Value) -> Fail | int:
    """How many trailing axes of `x` both ReduceMeans reduce (what the fused op normalizes, from
    axis -k on), or why they do not reduce a trailing block of axes alike."""
    x_rank = rank(x)
    found = None
    for node in (first, second):
        if node is None:
            continue
        axes = reduce_mean_axes(node)
        if axes is None:
            return fail("axes", f"axes input '{value_name(node.inputs[1])}' of {describe(node)} is not a constant")
        if not axes:
            return fail("axes", f"{describe(node)} reduces over every axis, not the last one")
        if int(attr(node, "keepdims", 1)) != 1:
            return fail("axes", f"{describe(node)} has keepdims=0; the pattern needs the reduced axis kept")
        trailing = _trailing_count(axes, x_rank)
        if trailing is None:
            where = f"rank {x_rank}" if x_rank is not None else "unknown rank"
            return fail("axes", f"{describe(node)} reduces axes {axes} of '{value_name(x)}' ({where}); "
                        "the fused op normalizes a block of trailing axes only")
        if found is not None and trailing != found:
            return fail("axes", f"the mean and the variance reduce different axes ({found} and {trailing} trailing)")
        found = trailing
    return found


def _trailing_count(axes: list[int], x_rank: int | None) -> int | None:
    """k when `axes` are exactly the last k axes (-k..-1), else None."""
    if len(set(axes)) != len(axes):
        return None
    if all(a < 0 for a in axes):
        normalized = sorted(axes)
        return len(axes) if normalized == list(range(-len(axes), 0)) else None
    if x_rank is None:
        return None  # a non-negative axis of a tensor of unknown rank: which one is unknown
    normalized = sorted(a + x_rank if a < 0 else a for a in axes)
    return len(axes) if normalized == list(range(x_rank - len(axes), x_rank)) else None


def affine_tail(normalized: ir.Value, x: ir.Value, with_beta: bool, axes: int = 1, cast_ok=None):
    """[Cast] -> Mul(gamma) [-> Add(beta)]: (gamma, beta, nodes) or a near miss.

    `axes`: how many trailing axes are normalized; gamma and beta have exactly their shape and the
    type of the value they scale. `cast_ok`: which Casts in front of the Mul are absorbed
    (dtype-keeping ones unless said)."""
    nodes: list[ir.Node] = []
    user = reader(normalized, "Cast", "Mul")
    if is_op(user, "Cast"):
        if not (cast_ok or keeps_dtype)(user):
            return cast_fail(user) if cast_ok is None else cast_fail(user, _PRECISION_ONLY)
        nodes.append(user)
        normalized = user.outputs[0]
        user = reader(normalized, "Mul")
    if user is None:
        return fail("gamma", f"the normalized value '{value_name(normalized)}' feeds {_readers(normalized)}, not Mul(gamma)")
    nodes.append(user)
    gamma = other_input(user, normalized)
    failure = _check_weight("gamma", gamma, user, x, axes, normalized)
    if failure:
        return failure
    if not with_beta:
        return gamma, None, nodes
    add = reader(user.outputs[0], "Add")
    if add is None:
        return fail("beta", f"the Mul by gamma {describe(user)} feeds {_readers(user.outputs[0])}, not Add(beta)")
    nodes.append(add)
    beta = other_input(add, user.outputs[0])
    failure = _check_weight("beta", beta, add, x, axes, normalized)
    if failure:
        return failure
    if list(gamma.shape or ()) != list(beta.shape or ()) and static_shape(gamma) != static_shape(beta):
        return fail("beta", f"gamma '{value_name(gamma)}' has shape {list(gamma.shape or ())} but beta "
                    f"'{value_name(beta)}' has {list(beta.shape or ())}")
    return gamma, beta, nodes


def _check_weight(role: str, weight: ir.Value | None, node: ir.Node, x: ir.Value, axes: int, scaled: ir.Value) -> Fail | None:
    shape = static_shape(weight)
    if axes > 1:  # over several trailing axes the weight has exactly their (known) shape
        trailing = tuple(x.shape[-axes:]) if x.shape is not None and len(x.shape) >= axes else None
        if shape is None or trailing is None or shape != trailing:
            return fail(role, f"{role} '{value_name(weight)}' of {describe(node)} has shape "
                        f"{list(shape) if shape is not None else 'unknown'}, not the normalized axes' "
                        f"{list(trailing) if trailing is not None else 'unknown'}")
        return None
    hidden = x.shape[-1] if x.shape is not None and len(x.shape) else None
    if shape is None and _same_symbolic_length(weight, hidden):
        # [d] against x's last axis [.., d]: the same symbol, so the same length whatever d is.
        shape = (hidden,)
    elif shape is None or len(shape) != 1:
        shown = "unknown" if weight is None or weight.shape is None else f"rank-{len(weight.shape)}"
        if shown == "rank-1":
            return fail(role, f"{role} '{value_name(weight)}' of {describe(node)} has length "
                        f"'{weight.shape[0]}', which is not known to equal the last dimension "
                        f"'{hidden}' of '{value_name(x)}'")
        return fail(role, f"{role} '{value_name(weight)}' of {describe(node)} has {shown} shape, not one known dimension")
    if isinstance(hidden, int) and isinstance(shape[0], int) and shape[0] != hidden:
        return fail(role, f"{role} '{value_name(weight)}' has {shape[0]} elements but '{value_name(x)}' "
                    f"has last dimension {hidden}")
    if scaled.dtype is not None and weight.dtype is not None and weight.dtype != scaled.dtype:
        return fail(role, f"{role} '{value_name(weight)}' is {_dtype_name(weight.dtype)} but "
                    f"'{value_name(scaled)}' is {_dtype_name(scaled.dtype)}")
    return None


def _same_symbolic_length(weight: ir.Value | None, hidden) -> bool:
    """Whether `weight` is 1-D with a symbolic length that is the symbol `hidden` names."""
    if weight is None or weight.shape is None or len(weight.shape) != 1 or hidden is None:
        return False
    length = weight.shape[0]
    return isinstance(length, ir.SymbolicDim) and length.value is not None and length == hidden


def _centering_mean(squared: ir.Value) -> ir.Node | None:
    """The ReduceMean m when `squared` is Pow(Sub(a, m), 2) or Mul(d, d) of such a Sub (through a Cast)."""
    square = producer(squared)
    if is_op(square, "Cast"):
        square = producer(square.inputs[0])
    if not (is_op(square, "Pow") or (is_op(square, "Mul") and square.inputs[0] is square.inputs[1])):
        return None
    sub = producer(square.inputs[0])
    if is_op(sub, "Cast"):
        sub = producer(sub.inputs[0])
    mean = producer(sub.inputs[1]) if is_op(sub, "Sub") else None
    return mean if is_op(mean, "ReduceMean") else None


def reader(value: ir.Value, *op_types: str) -> ir.Node | None:
    """The first ONNX-domain node of one of `op_types` reading `value`.

    Other readers (and graph outputs) are left to the driver's boundary check, whose near
    miss names the reader that blocked the fusion.
    """
    return next((n for n in consumers(value) if any(is_op(n, t) for t in op_types)), None)


def _readers(value: ir.Value) -> str:
    users = consumers(value)
    names = [describe(u) for u in users]
    if value.is_graph_output():
        names.append("the graph output")
    if not names:
        return "nothing"
    return " and ".join(names) if len(names) <= 2 else f"{len(names)} readers ({', '.join(names[:3])}, ...)"


def _dtype_name(dtype) -> str:
    return "unknown dtype" if dtype is None else ir.DataType(dtype).name.lower()


