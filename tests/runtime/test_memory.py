"""SessionOptions.enable_cpu_mem_arena (runtime/memory.py): glibc keeps freed memory for the next run."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from runtime import SessionOptions, memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def test_the_arena_is_on_by_default_as_in_onnxruntime():
    assert SessionOptions().enable_cpu_mem_arena is True


def test_a_non_boolean_arena_option_is_refused():
    with pytest.raises(ValueError, match="enable_cpu_mem_arena must be True or False, got 'yes'"):
        SessionOptions(enable_cpu_mem_arena="yes")


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's; elsewhere the option does nothing")
def test_a_session_applies_it_once_and_a_session_without_it_does_not():
    # A fresh interpreter: the setting is process-wide and one-way.
    script = """
import numpy as np
from onnx import TensorProto, helper
import runtime
from runtime import memory
graph = helper.make_graph(
    [helper.make_node("Relu", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
runtime.InferenceSession(model.SerializeToString(), runtime.SessionOptions(enable_cpu_mem_arena=False))
print(memory._applied)
runtime.InferenceSession(model.SerializeToString(), runtime.SessionOptions())
print(memory._applied)
"""
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["None", "True"]


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's; elsewhere the option does nothing")
def test_glibc_accepts_the_settings():
    assert memory.keep_freed_memory() is True
