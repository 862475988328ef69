"""How tables name a fused op: without its domain, unless that makes two ops one.

"com.microsoft.BiasGelu" reads as "BiasGelu" to anyone who knows the engines (a custom op keeps its
domain: "ai.onnx.contrib.Passthrough" says what it is). But ONNX has grown
standard ops with the names of onnxruntime's contrib ops (Gelu at opset 20, Attention and
RotaryEmbedding at opset 23): an opset-23 export's own Attention beside the com.microsoft.Attention
our optimizer fuses showed as "Attention 0 → 2" and "Attention 2 → 0" in one cell. Where a short name
would stand for two ops, each keeps its domain (the standard one shows as "ai.onnx.Attention").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


def short_names(ops: Iterable[str]) -> dict[str, str]:
    """Each op key of `ops` → the name a table shows for it among the others."""
    keys = list(dict.fromkeys(ops))
    counts = Counter(_short(op) for op in keys)
    return {op: _short(op) if counts[_short(op)] == 1 else _full(op) for op in keys}


def _short(op: str) -> str:
    return op.removeprefix("com.microsoft.")


def _full(op: str) -> str:
    return op if "." in op else f"ai.onnx.{op}"
