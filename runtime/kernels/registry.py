"""The kernel registry: an explicit list of kernel families, looked up by (domain, op, opset).

For a node, the kernel with the highest `since_version` not above the model's opset for
its domain is chosen, as ONNX Runtime and the ONNX reference evaluator do.
"""

from __future__ import annotations

from collections import defaultdict

# Each family module ends with `KERNELS = [...]`; this import list is the registry.
from runtime.kernels import (
    activation,
    attention,
    col2im,
    contrib_activation,
    contrib_attention,
    contrib_group_query_attention,
    contrib_linear,
    contrib_normalization,
    contrib_rotary_embedding,
    control_flow,
    conv,
    conv_nhwc,
    creation,
    deform_conv,
    detection,
    elementwise,
    grid_sample,
    indexing,
    linalg,
    loss,
    normalization,
    pool,
    quantization,
    recurrent,
    reduction,
    resize,
    rotary_embedding,
    tensor,
    window,
)
from runtime.kernels.base import Kernel

FAMILIES: list = [
    elementwise,
    activation,
    reduction,
    tensor,
    creation,
    indexing,
    linalg,
    conv,
    conv_nhwc,
    deform_conv,
    col2im,
    pool,
    resize,
    quantization,
    recurrent,
    detection,
    grid_sample,
    window,
    loss,
    normalization,
    attention,
    rotary_embedding,
    control_flow,
    contrib_activation,
    contrib_normalization,
    contrib_attention,
    contrib_group_query_attention,
    contrib_rotary_embedding,
    contrib_linear,
]

KERNELS: list[type[Kernel]] = [kernel for family in FAMILIES for kernel in family.KERNELS]


def _normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


_BY_OP: dict[tuple[str, str], list[type[Kernel]]] = defaultdict(list)
for _kernel in KERNELS:
    _BY_OP[(_normalize_domain(_kernel.domain), _kernel.op_type)].append(_kernel)
for _versions in _BY_OP.values():
    _versions.sort(key=lambda k: k.since_version)


def find_kernel(domain: str, op_type: str, opset: int) -> type[Kernel] | None:
    """The kernel class for an op at a model's opset, or None when we have none."""
    best = None
    for kernel in _BY_OP.get((_normalize_domain(domain), op_type), ()):
        if kernel.since_version <= opset:
            best = kernel
    return best
