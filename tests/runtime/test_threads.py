"""`intra_op_num_threads` reaches every library a session's kernels run on (runtime/threads.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.kernels import onednn, openmp, row_threads

ROOT = Path(__file__).resolve().parents[2]

# oneDNN loaded before the session, as in a process whose first session (a default one, or a
# model with convolutions) loaded it; numba's pool not started yet.
_ONE_THREAD_SESSION = """
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from runtime import InferenceSession, SessionOptions
from runtime.kernels import onednn, openmp
onednn.available()
weight = numpy_helper.from_array(np.ones((64, 512), np.float32), "w")
graph = helper.make_graph(
    [helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
    [helper.make_tensor_value_info("a", TensorProto.FLOAT, [16, 64])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 512])], [weight],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
session = InferenceSession(model, SessionOptions(intra_op_num_threads=1, kernel_libraries={"gemm": "onednn"}))
session.run(None, {"a": np.ones((16, 64), np.float32)})
import numba
print(openmp.load().omp_get_max_threads(), numba.get_num_threads())
"""


@pytest.mark.skipif(
    not onednn.available() or not openmp.available() or not row_threads.enabled(),
    reason="needs oneDNN and Intel OpenMP (the onednn and mkl extras)",
)
def test_a_one_thread_session_runs_onednn_and_the_row_loops_on_one_thread():
    # numba's pool, started by the session's thread limit, used to set OpenMP's count back to
    # one per core after oneDNN's had been set: "one thread" products ran on two.
    done = subprocess.run(
        [sys.executable, "-c", _ONE_THREAD_SESSION], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.split() == ["1", "1"], done.stderr
