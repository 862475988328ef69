"""Export the attention-form fixtures in tests/models/attention_forms/ (tiny random Hugging Face models).

    .venv/bin/python tools/export_attention_forms.py [KIND_EXPORTER ...]   # needs `make install-export`

Each file is one attention form AttentionFusion must fuse exactly or refuse with a reason
(docs/optimizer.md): multi-query K/V (Falcon, GPTBigCode), a relative position bias beside the mask (MPNet),
[batch*heads, ...] products (DeBERTa-v2), ALiBi on them (Bloom), ALiBi
under a masked_fill (MPT; in TorchScript, and in T5's encoder, K's reshape also read by a Transpose outside
the block), Q/K/V in heads whose heads inference cannot name (TorchScript's partial
rotary in GPT-NeoX and Phi-3, Gemma's repeated K/V). The sizes are the smallest that keep
every form (hidden 32, 4 heads of 8, 2 layers, vocab 1000 so tests.oracle.fixture_feeds' ids fit),
so each file stays near 100-250 KB; weights are seeded random and perturbed off their init, as
tools/make_fixtures.py does, so a fusion dropping a bias or a norm weight changes results.
Input: input_ids, attention_mask int64 [batch, seq]; output: last_hidden_state.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import onnx
import torch
import transformers
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "models" / "attention_forms"
SIZES = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 64,
         "vocab_size": 1000, "max_position_embeddings": 64}


def config(kind: str):
    t = transformers
    if kind == "falcon":  # multi-query: one K/V head shared by every query head, rotary
        return t.FalconConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=1000,
                              multi_query=True, new_decoder_architecture=False, parallel_attn=True, alibi=False)
    if kind == "bigcode":  # multi-query, learned positions, no rotary
        return t.GPTBigCodeConfig(n_embd=32, n_head=4, n_layer=2, n_inner=64, vocab_size=1000, n_positions=64,
                                  multi_query=True, bos_token_id=0, eos_token_id=0)
    if kind == "deberta_v2":  # Q·Kᵀ and probs·V as [batch*heads, ...] 3-D products around a 4-D Softmax
        return t.DebertaV2Config(**SIZES, type_vocab_size=0)
    if kind == "bloom":  # ALiBi added to [batch*heads, S, T] scores (baddbmm); Casts after Softmax
        return t.BloomConfig(hidden_size=32, n_head=4, n_layer=2, vocab_size=1000)
    if kind == "mpt":  # ALiBi [heads, 1, T] added under a masked_fill
        return t.MptConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=1000, max_seq_len=64, expansion_ratio=2)
    if kind == "t5_encoder":  # relative position bias sized by K's length, read off a second Transpose of K
        return t.T5Config(d_model=32, d_kv=8, d_ff=64, num_heads=4, num_layers=2, vocab_size=1000)
    if kind == "mpnet":  # a relative position bias added to the scores before the padding mask
        return t.MPNetConfig(**SIZES)
    if kind == "gpt_neox":  # partial rotary: a quarter of each head rotated, the rest passed through
        return t.GPTNeoXConfig(**SIZES, use_cache=False)
    if kind == "phi3":  # rotary written as partial (an empty pass-through concatenated); grouped-query K/V
        return t.Phi3Config(**SIZES, num_key_value_heads=2, use_cache=False, pad_token_id=0, bos_token_id=1,
                            eos_token_id=2)
    if kind == "gemma":  # one K/V head repeated to every query head; head_dim set apart from hidden
        return t.GemmaConfig(**SIZES, num_key_value_heads=1, head_dim=8, use_cache=False)
    raise KeyError(f"unknown kind {kind!r}")


class _LastHidden(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                          return_dict=True).last_hidden_state


@torch.no_grad()
def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "t5_encoder":  # no AutoModel of the encoder alone
        model = transformers.T5EncoderModel(config(kind)).eval()
    else:
        model = transformers.AutoModel.from_config(config(kind)).eval()
    generator = torch.Generator().manual_seed(1)
    for parameter in model.parameters():
        parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return _LastHidden(model).eval()


def export(kind: str, exporter: str, path: Path) -> None:
    model = build(kind)
    ids = torch.randint(2, 1000, (2, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0
    names = {"input_names": ["input_ids", "attention_mask"], "output_names": ["last_hidden_state"]}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            axes = {"batch": 0, "seq": 1}
            torch.onnx.export(model, (ids, mask), str(path), dynamo=False, opset_version=14, **names,
                              dynamic_axes={n: {v: k for k, v in axes.items()} for n in names["input_names"]})
        else:
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", min=2, max=64)
            program = torch.onnx.export(model, (ids, mask), dynamo=True, opset_version=20, **names,
                                        dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}), optimize=True)
            program.save(str(path), external_data=False)
    proto = onnx.load(str(path))
    for node in proto.graph.node:  # the dynamo exporter's stack traces: absolute paths, no semantics
        del node.metadata_props[:]
    onnx.save(proto, str(path))


FORMS = ["falcon_dynamo", "bigcode_torchscript", "mpnet_dynamo", "deberta_v2_dynamo", "deberta_v2_torchscript",
         "bloom_dynamo", "bloom_torchscript", "mpt_dynamo", "gpt_neox_torchscript", "phi3_torchscript",
         "gemma_torchscript", "falcon_torchscript", "mpt_torchscript", "t5_encoder_torchscript"]


def main(argv: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for form in argv or FORMS:
        kind, exporter = form.rsplit("_", 1)
        path = OUT / f"{form}.onnx"
        export(kind, exporter, path)
        print(f"{path.relative_to(OUT.parent.parent.parent)}: {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main(sys.argv[1:])
