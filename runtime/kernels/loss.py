"""The loss ops ONNX exports of training graphs carry (and some evaluation graphs keep):
NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opsets 13 and 12/13).

Both pick, for every sample (and every spatial position of an (N, C, d1, ...) input), the
class the target names: one gather along the class axis, not a loop. A target equal to
`ignore_index` contributes nothing and, with reduction "mean", does not count; class `weight`s
scale each pick and, for "mean", the denominator (the weighted mean PyTorch computes).
"""

from __future__ import annotations

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, UnsupportedOp


class NegativeLogLikelihoodLoss(Kernel):
    op_type = "NegativeLogLikelihoodLoss"
    since_version = 12

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.reduction = self.attr("reduction", "mean")
        if self.reduction not in ("none", "sum", "mean"):
            raise UnsupportedOp(f"{self.op_type} '{node.name}': unknown reduction {self.reduction!r}")
        self.ignore_index = self.attr("ignore_index")

    def run(self, x, target, weight=None):
        return (self.loss(x, target, weight),)

    def loss(self, log_prob, target, weight):
        """-log_prob[n, target[n, ...], ...] weighted, masked and reduced; in log_prob's dtype."""
        xp = self.xp
        if log_prob.ndim < 2 or target.shape != log_prob.shape[:1] + log_prob.shape[2:]:
            raise ValueError(
                f"{self.op_type} '{self.node.name}': input {list(log_prob.shape)} and target "
                f"{list(target.shape)} do not match as (N, C, d1, ...) and (N, d1, ...)"
            )
        classes = log_prob.shape[1]
        index = xp.clip(target, 0, classes - 1).astype(np.int64)  # an ignored target may be out of range
        picked = -xp.take_along_axis(log_prob, index[:, None], axis=1)[:, 0]
        scale = xp.ones(target.shape, log_prob.dtype) if weight is None else weight[index].astype(log_prob.dtype)
        if self.ignore_index is not None:
            scale = xp.where(target == self.ignore_index, log_prob.dtype.type(0), scale)
        loss = picked * scale
        if self.reduction == "sum":
            return xp.asarray(loss.sum(), dtype=log_prob.dtype)
        if self.reduction == "mean":
            return xp.asarray(loss.sum() / scale.sum(), dtype=log_prob.dtype)
        return loss


class SoftmaxCrossEntropyLoss(NegativeLogLikelihoodLoss):
    """NegativeLogLikelihoodLoss of log_softmax over the class axis; its optional second output
    is that log-probability tensor."""

    op_type = "SoftmaxCrossEntropyLoss"
    since_version = 12

    def run(self, scores, labels, weights=None):
        xp = self.xp
        shifted = scores - scores.max(axis=1, keepdims=True)
        log_prob = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        loss = self.loss(log_prob, labels, weights)
        if len(self.node.outputs) > 1 and self.node.outputs[1].name:
            return loss, log_prob
        return (loss,)


KERNELS = [NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss]
