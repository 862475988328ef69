"""What the pattern builders share: a model over float tensors and the constants they feed it."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

# Every builder returns an onnx.ModelProto with float inputs named in `inputs`, so a test
# can feed random data to onnxruntime. Node names follow the exporters' "/mlp/Op" style,
# which is how near misses name their anchor.


def float_model(nodes, inputs, outputs, initializers=(), *, opset=14, extra_outputs=(), extra_shape=(2, 4, 16)):
    """A model over float tensors: `inputs`/`outputs` are {name: shape}; `extra_outputs` name
    intermediate values made graph outputs too, all of shape `extra_shape`."""
    graph = helper.make_graph(
        nodes,
        "pattern",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(extra_shape)) for n in extra_outputs],
        list(initializers),
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports)


def scalar(name, value):
    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


def vector(name, size, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(size).astype(np.float32), name)


def mul(a, b, out, name, commute=False):
    return helper.make_node("Mul", [b, a] if commute else [a, b], [out], name=name)
