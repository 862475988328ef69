"""AttentionFusion: a multi-head self-attention block => com.microsoft.Attention or MultiHeadAttention.

Anchored on Softmax, in stages as onnxscript's attention rewrites are (sdpa -> mha -> gqa), each in
its own module:

  1. attention_sdpa.py: the scaled-dot-product core, Q·Kᵀ -> scale -> mask -> Softmax -> [NaN
     guard] -> ·V, with the mask's and the guard's place in the fused op;
  2. attention_packed.py: Q, K and V projected from one input (MatMul+Add, GPT-2's Gemm), packed
     into Attention's one weight, with its past/present cache and causal `unidirectional`;
     attention_heads.py: Q, K and V already in heads (after rotary embedding, a grouped-query
     repeat), MultiHeadAttention;
  3. group_query_attention_fusion.py (a rule of its own, after this one): the MultiHeadAttention
     whose K and V are repeated heads becomes GroupQueryAttention.

attention_layout.py holds the layout probe all of them prove head splits and merges with. One rule
rather than a rule per stage: a core with no fused form around it is not a rewrite of its own,
and a user disabling "AttentionFusion" (ONNX Runtime's name) expects the whole block left alone.

Every stage returns a `Fail` (optimizer.rule) where the pattern stops; the reasons are the near
misses users read.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.fusions.attention_heads import match_heads, rewrite_heads
from optimizer.fusions.attention_layout import RULE_NAME
from optimizer.fusions.attention_packed import (
    match_packed,
    rewrite_packed,
    rewrite_projected,
    trace_projections,
)
from optimizer.fusions.attention_sdpa import match_sdpa
from optimizer.fusions.attention_shared import keep_shared, reads_own_output
from optimizer.rule import Fail, Match, Rule, fail


class AttentionFusion(Rule):
    name = RULE_NAME
    anchors = ("Softmax",)
    emits = ("com.microsoft.Attention", "com.microsoft.MultiHeadAttention")

    def match(self, graph: ir.Graph, softmax: ir.Node):
        sdpa = match_sdpa(graph, softmax)
        if isinstance(sdpa, Fail):
            return sdpa
        paths = trace_projections(sdpa)
        if isinstance(paths, dict):
            packed = match_packed(graph, sdpa, paths)
            return _acyclic(keep_shared(graph, packed, sdpa.core)) if isinstance(packed, Match) else packed
        # Q, K and V may arrive already projected and split into heads, with work between the
        # projection and the product (Llama's rotary embedding and grouped-query K/V repeat).
        role, broken = paths
        heads = match_heads(graph, sdpa)
        if isinstance(heads, Match):
            return _acyclic(keep_shared(graph, heads, sdpa.core))
        reason = f"{role} projection {broken}"
        if isinstance(heads, Fail):
            reason += f"; as heads for MultiHeadAttention: {heads.reason}"
        return fail("projection", reason, None)

    def rewrite(self, op: ir.tape.Tape, match: Match):
        if match.captures.get("heads") is not None:
            return rewrite_heads(op, match)
        if match.captures.get("projected") is not None:
            return rewrite_projected(op, match)
        return rewrite_packed(op, match)


def _acyclic(match: Match) -> Match | Fail:
    """`match`, or why its presents would feed the fused op itself. The present Shapes the heads
    form recomputes from its inputs (attention_heads._present_shape) read nothing the op writes."""
    recomputed = {id(reader.outputs[0]) for _, reader in match.captures.get("present_shapes", ())}
    return reads_own_output(match, [v for v in match.outputs[1:] if id(v) not in recomputed]) or match


__all__ = ["AttentionFusion"]
