"""Recurrent kernels: RNN, GRU and LSTM, every direction, layout and optional input.

Each direction runs the same way: one GEMM projects every time step's input onto all gates
at once (X is [seq * batch, input]), with the biases that sit outside any gate product
folded in; then a Python loop over time steps does one [batch, hidden] x [hidden, gates]
GEMM for the recurrence plus elementwise gate math. Time steps are inherently sequential,
so the loop is the floor; everything inside it is a few whole-batch array operations.

sequence_lens: a batch entry past its length keeps its state and emits zeros, so Y_h/Y_c
hold each sequence's state at its own last step. The reverse direction walks each sequence
from its own last valid step back to its first: inputs are gathered into that order once,
and outputs scattered back through the same (self-inverse) permutation.

Activation names and their alpha/beta are the spec's list; alpha/beta values are consumed in
order by the activations that take them, with the ONNX operators' own defaults otherwise.
The spec's `clip` bounds the gates' activation inputs, peephole terms included; like ONNX
Runtime we do not clip the cell state LSTM's `h` activation reads (the spec's wording allows
either, and clipping it changes outputs). float16 is computed in float32.
"""

from __future__ import annotations

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, UnsupportedOp


def _sigmoid(xp, x, alpha, beta):
    # Written through tanh so large |x| neither overflows exp nor loses precision.
    return 0.5 * (xp.tanh(0.5 * x) + 1)


def _hard_sigmoid(xp, x, alpha, beta):
    return xp.clip(alpha * x + beta, 0, 1)


def _elu(xp, x, alpha, beta):
    return xp.where(x >= 0, x, alpha * xp.expm1(xp.minimum(x, 0)))


def _softplus(xp, x, alpha, beta):
    return xp.logaddexp(0, x)


# name (lower case): (function(xp, x, alpha, beta), takes alpha, takes beta, default alpha, default beta)
_ACTIVATIONS = {
    "relu": (lambda xp, x, a, b: xp.maximum(x, 0), False, False, 0.0, 0.0),
    "tanh": (lambda xp, x, a, b: xp.tanh(x), False, False, 0.0, 0.0),
    "sigmoid": (_sigmoid, False, False, 0.0, 0.0),
    "affine": (lambda xp, x, a, b: a * x + b, True, True, 1.0, 0.0),
    "leakyrelu": (lambda xp, x, a, b: xp.where(x >= 0, x, a * x), True, False, 0.01, 0.0),
    "thresholdedrelu": (lambda xp, x, a, b: xp.where(x > a, x, 0), True, False, 1.0, 0.0),
    "scaledtanh": (lambda xp, x, a, b: a * xp.tanh(b * x), True, True, 1.0, 1.0),
    "hardsigmoid": (_hard_sigmoid, True, True, 0.2, 0.5),
    "elu": (_elu, True, False, 1.0, 0.0),
    "softsign": (lambda xp, x, a, b: x / (1 + xp.abs(x)), False, False, 0.0, 0.0),
    "softplus": (_softplus, False, False, 0.0, 0.0),
}


class _Activation:
    def __init__(self, function, alpha, beta, clip):
        self.function, self.alpha, self.beta, self.clip = function, alpha, beta, clip

    def __call__(self, xp, x):
        if self.clip is not None:
            x = xp.clip(x, -self.clip, self.clip)
        return self.function(xp, x, self.alpha, self.beta)


class _Recurrent(Kernel):
    """What RNN, GRU and LSTM share: attributes, layouts, directions, sequence_lens, outputs.
    Subclasses give `gates`, `default_activations` and `_step`."""

    gates = 1
    default_activations: tuple[str, ...] = ()
    unclipped: tuple[int, ...] = ()  # positions among a direction's activations that clip skips
    has_cell = False

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.where = f"{self.op_type} '{node.name}'"
        self.direction = self.attr("direction", "forward")
        if self.direction not in ("forward", "reverse", "bidirectional"):
            raise UnsupportedOp(f"{self.where}: unknown direction {self.direction!r}")
        self.directions = 2 if self.direction == "bidirectional" else 1
        self.hidden_size = self.attr("hidden_size")
        self.layout = self.attr("layout", 0)
        if self.layout not in (0, 1):
            raise UnsupportedOp(f"{self.where}: unknown layout {self.layout}")
        clip = self.attr("clip")
        self.activations = self._read_activations(None if clip is None else float(clip))

    def _read_activations(self, clip):
        names = self.attr("activations") or list(self.default_activations) * self.directions
        per_direction = len(self.default_activations)
        if len(names) != per_direction * self.directions:
            raise ValueError(
                f"{self.where}: {len(names)} activations given, expected {per_direction} per direction "
                f"x {self.directions} direction(s)"
            )
        alphas = list(self.attr("activation_alpha") or [])
        betas = list(self.attr("activation_beta") or [])
        built = []
        for position, name in enumerate(names):
            entry = _ACTIVATIONS.get(name.lower())
            if entry is None:
                raise UnsupportedOp(f"{self.where}: unknown activation {name!r}")
            function, takes_alpha, takes_beta, alpha, beta = entry
            if takes_alpha and alphas:
                alpha = alphas.pop(0)
            if takes_beta and betas:
                beta = betas.pop(0)
            skip = position % per_direction in self.unclipped
            built.append(_Activation(function, alpha, beta, None if skip else clip))
        return [built[d * per_direction : (d + 1) * per_direction] for d in range(self.directions)]

    def run(self, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
        xp = self.xp
        dtype = x.dtype
        compute = np.float32 if dtype == np.float16 else dtype
        x, w, r = x.astype(compute, copy=False), w.astype(compute, copy=False), r.astype(compute, copy=False)
        if self.layout == 1:  # [batch, seq, ...] -> [seq, batch, ...]
            x = x.transpose(1, 0, 2)
            initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
            initial_c = None if initial_c is None else initial_c.transpose(1, 0, 2)
        seq, batch, _ = x.shape
        hidden = r.shape[-1]
        if self.hidden_size is not None and hidden != self.hidden_size:
            raise ValueError(
                f"{self.where}: R has hidden size {hidden}, attribute hidden_size is {self.hidden_size}"
            )
        if w.shape[0] != self.directions or w.shape[1] != self.gates * hidden:
            raise ValueError(
                f"{self.where}: W has shape {list(w.shape)}, expected [{self.directions}, {self.gates * hidden}, input]"
            )
        lengths = None
        if sequence_lens is not None:
            lengths = self.backend.to_host(sequence_lens).astype(np.int64).reshape(-1)
            if lengths.size != batch or (lengths < 0).any() or (lengths > seq).any():
                raise ValueError(
                    f"{self.where}: sequence_lens {lengths.tolist()} do not fit batch {batch}, seq {seq}"
                )
            if (lengths == seq).all():
                lengths = None  # every sequence is full length: no masking needed

        ys, last_h, last_c = [], [], []
        for d in range(self.directions):
            reverse = self.direction == "reverse" or d == 1
            order = _time_order(seq, batch, lengths, reverse)
            if order is not None:
                order = (xp.asarray(order), xp.arange(batch)[None, :])
            xd = x if order is None else x[order]
            h0 = xp.zeros((batch, hidden), compute) if initial_h is None else initial_h[d].astype(compute)
            c0 = None
            if self.has_cell:
                c0 = xp.zeros((batch, hidden), compute) if initial_c is None else initial_c[d].astype(compute)
            bias = None if b is None else b[d].astype(compute)
            peephole = None if p is None else p[d].astype(compute)
            y, h, c = self._direction(xd, w[d], r[d], bias, peephole, h0, c0, lengths, self.activations[d])
            if order is not None:
                y = y[order]
            ys.append(y)
            last_h.append(h)
            last_c.append(c)
        y = xp.stack(ys, axis=1)  # [seq, directions, batch, hidden]
        y_h = xp.stack(last_h)  # [directions, batch, hidden]
        outputs = [y, y_h]
        if self.has_cell:
            outputs.append(xp.stack(last_c))
        if self.layout == 1:
            outputs = [outputs[0].transpose(2, 0, 1, 3)] + [state.transpose(1, 0, 2) for state in outputs[1:]]
        return tuple(xp.ascontiguousarray(out).astype(dtype, copy=False) for out in outputs)

    def _direction(self, x, w, r, bias, peephole, h, c, lengths, activations):
        xp = self.xp
        seq, batch, _ = x.shape
        hidden = r.shape[-1]
        projected = self._project(x.reshape(seq * batch, -1), w, bias, hidden).reshape(seq, batch, -1)
        r_t = xp.ascontiguousarray(r.T)
        y = xp.zeros((seq, batch, hidden), x.dtype)
        for t in range(seq):
            new_h, new_c = self._step(projected[t], h, c, r_t, bias, peephole, hidden, activations)
            if lengths is not None:
                active = xp.asarray((t < lengths)[:, None])
                new_h = xp.where(active, new_h, h)
                if new_c is not None:
                    new_c = xp.where(active, new_c, c)
                y[t] = xp.where(active, new_h, 0)
            else:
                y[t] = new_h
            h, c = new_h, new_c
        return y, h, c

    def _project(self, x, w, bias, hidden):
        """Every step's input projection, plus the biases that add outside gate products."""
        projected = x @ w.T
        if bias is not None:
            projected += bias[: self.gates * hidden] + bias[self.gates * hidden :]
        return projected

    def _step(self, projected, h, c, r_t, bias, peephole, hidden, activations):
        raise NotImplementedError


def _time_order(seq, batch, lengths, reverse):
    """[seq, batch] time indices that put each sequence in processing order, or None when
    the plain order serves. Reversal stays inside each sequence's length; padding stays put,
    so applying the permutation twice restores the original order."""
    if not reverse:
        return None
    steps = np.arange(seq)[:, None]
    if lengths is None:
        return np.broadcast_to(seq - 1 - steps, (seq, batch))
    return np.where(steps < lengths[None, :], lengths[None, :] - 1 - steps, steps)


class RNN(_Recurrent):
    """H = f(X W^T + H R^T + Wb + Rb)."""

    op_type = "RNN"
    since_version = 7
    gates = 1
    default_activations = ("Tanh",)

    def _step(self, projected, h, c, r_t, bias, peephole, hidden, activations):
        (f,) = activations
        return f(self.xp, projected + h @ r_t), None


class GRU(_Recurrent):
    """Gates z, r, h. With linear_before_reset the reset gate scales (H R_h^T + Rb_h) rather
    than H before the product, which is why Rb_h stays out of the up-front projection."""

    op_type = "GRU"
    since_version = 7
    gates = 3
    default_activations = ("Sigmoid", "Tanh")

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.linear_before_reset = bool(self.attr("linear_before_reset", 0))

    def _project(self, x, w, bias, hidden):
        projected = x @ w.T
        if bias is not None:
            w_bias, r_bias = bias[: 3 * hidden], bias[3 * hidden :]
            projected += w_bias
            projected[:, : 2 * hidden] += r_bias[: 2 * hidden]
        return projected

    def _step(self, projected, h, c, r_t, bias, peephole, hidden, activations):
        xp = self.xp
        f, g = activations
        r_zr, r_h = r_t[:, : 2 * hidden], r_t[:, 2 * hidden :]
        zr = f(xp, projected[:, : 2 * hidden] + h @ r_zr)
        z, reset = zr[:, :hidden], zr[:, hidden:]
        rb_h = 0 if bias is None else bias[5 * hidden :]
        if self.linear_before_reset:
            candidate = g(xp, projected[:, 2 * hidden :] + reset * (h @ r_h + rb_h))
        else:
            candidate = g(xp, projected[:, 2 * hidden :] + (reset * h) @ r_h + rb_h)
        return (1 - z) * candidate + z * h, None


class LSTM(_Recurrent):
    """Gates i, o, f, c; optional peepholes P = [Pi, Po, Pf]; input_forget couples f = 1 - i."""

    op_type = "LSTM"
    since_version = 7
    gates = 4
    default_activations = ("Sigmoid", "Tanh", "Tanh")
    unclipped = (2,)  # h, applied to the cell state
    has_cell = True

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.input_forget = bool(self.attr("input_forget", 0))

    def _step(self, projected, h, c, r_t, bias, peephole, hidden, activations):
        xp = self.xp
        f, g, act_h = activations
        gates = projected + h @ r_t
        pre_i, pre_o = gates[:, :hidden], gates[:, hidden : 2 * hidden]
        pre_f, pre_c = gates[:, 2 * hidden : 3 * hidden], gates[:, 3 * hidden :]
        if peephole is not None:
            pre_i = pre_i + peephole[:hidden] * c
            pre_f = pre_f + peephole[2 * hidden :] * c
        i = f(xp, pre_i)
        forget = 1 - i if self.input_forget else f(xp, pre_f)
        new_c = forget * c + i * g(xp, pre_c)
        if peephole is not None:
            pre_o = pre_o + peephole[hidden : 2 * hidden] * new_c
        o = f(xp, pre_o)
        return o * act_h(xp, new_c), new_c


KERNELS = [
    RNN,
    GRU,
    LSTM,
]
