"""fusionwatch's own executor: numpy kernels run by a planned, sequential loop.

    from runtime import InferenceSession, SessionOptions
    session = InferenceSession("model.onnx", SessionOptions(graph_optimization_level="all"))
    outputs = session.run(None, {"input": x})

Modules: options (SessionOptions), session (InferenceSession), plan (node order, kernels,
slots, release points), plan_function (the plan written out as one Python function, what
most runs execute), executor (GraphExecutor: runs a plan, for the session and for subgraphs;
the plain loop for first and profiled runs), profiler (ONNX Runtime-format traces), threads
(intra_op_num_threads), errors, providers (onnxruntime's providers list -> backend),
kernels/ (kernels/onednn.py is the oneDNN binding), backends/ (numpy; CUDA on CuPy).
"""

from runtime.backends.cuda import CudaUnavailableError
from runtime.errors import (
    GraphPlanError,
    InvalidFeedError,
    InvalidOutputNameError,
    NodeExecutionError,
    UnsupportedModelError,
    UnsupportedOp,
)
from runtime.executor import GraphExecutor
from runtime.options import SessionOptions
from runtime.session import InferenceSession, MemoryStats, NodeArg

__all__ = [
    "CudaUnavailableError",
    "GraphExecutor",
    "GraphPlanError",
    "InferenceSession",
    "InvalidFeedError",
    "InvalidOutputNameError",
    "MemoryStats",
    "NodeArg",
    "NodeExecutionError",
    "SessionOptions",
    "UnsupportedModelError",
    "UnsupportedOp",
]
