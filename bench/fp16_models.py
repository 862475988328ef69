"""Real-size float16 transformers with random weights, for bench/narrow_margin.py (docs/numerics.md, "16-bit floats").

    .venv/bin/python -m bench.fp16_models bert --layers 12 --out /tmp/fp16big    # bert12_fp32/_conv/_conv_keepio.onnx
    .venv/bin/python -m bench.fp16_models gpt2 llama --out /tmp/fp16big --half     # and <model>_half.onnx

BERT-base (`BertConfig()`: hidden 768, 12 heads, intermediate 3072; outputs last_hidden_state and
pooler_output), GPT-2 small with its LM head (768, 12 heads; logits), a Llama-like decoder (hidden 1024,
16 heads, 4 KV heads, intermediate 2816, vocabulary 32000; logits); `--layers` sets the depth (default:
12, 12, 8). Weights as transformers initializes them, then biases and norm weights moved N(0, 0.1) off
0/1 so that every term counts. Exported in float32 by `torch.onnx.export` (TorchScript, opset 17, batch
and sequence dynamic), then converted by `onnxruntime.transformers.float16.convert_float_to_float16`
with `keep_io_types` False (`_conv`) and True (`_conv_keepio`); `--half` also exports `model.half()`
(`_half`), which onnxruntime refuses to load (LayerNormalization: float16 input, float32 scale).
Everything goes to `--out`, not git: BERT-base is 440 MB in float32.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import onnx
import torch
import transformers
from torch import nn

from tools.make_zoo import Positional  # tensors in by position, a tuple out: what the exporter takes

SEQUENCE = 32  # of the export's example; the axis is dynamic
DEFAULT_LAYERS = {"bert": 12, "gpt2": 12, "llama": 8}


def build(name: str, layers: int) -> tuple[nn.Module, list[str], list[str]]:
    if name == "bert":
        config = transformers.BertConfig(num_hidden_layers=layers)
        return transformers.BertModel(config), ["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state", "pooler_output"]
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=layers, use_cache=False)
        return transformers.GPT2LMHeadModel(config), ["input_ids", "attention_mask"], ["logits"]
    if name == "llama":
        config = transformers.LlamaConfig(
            hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
            intermediate_size=2816, vocab_size=32000, max_position_embeddings=2048, use_cache=False,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config), ["input_ids", "attention_mask"], ["logits"]
    raise ValueError(f"unknown model {name!r}: bert, gpt2, llama")


@torch.no_grad()
def export(name: str, layers: int, folder: Path, half: bool) -> Path:
    torch.manual_seed(0)
    model, inputs, outputs = build(name, layers)
    generator = torch.Generator().manual_seed(1)
    for parameter in model.parameters():
        if parameter.dim() == 1:  # biases, norm scales and shifts
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)
    wrapped = Positional(model.eval(), inputs, outputs).eval()
    if half:
        wrapped = wrapped.half()
    ids = torch.randint(5, 1000, (1, SEQUENCE))
    feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    axes = {n: {0: "batch", 1: "seq"} for n in inputs}
    axes.update({n: {0: "batch"} if n == "pooler_output" else {0: "batch", 1: "seq"} for n in outputs})
    path = folder / f"{name}{layers}_{'half' if half else 'fp32'}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings
        torch.onnx.export(
            wrapped, tuple(feeds[n] for n in inputs), str(path), dynamo=False, opset_version=17,
            input_names=inputs, output_names=outputs, dynamic_axes=axes, do_constant_folding=True,
        )  # fmt: skip
    return path


def convert(path: Path) -> list[Path]:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(path))
    made = []
    for keep_io_types, suffix in ((False, "_conv"), (True, "_conv_keepio")):
        target = path.with_name(path.name.replace("_fp32", suffix))
        onnx.save(convert_float_to_float16(model, keep_io_types=keep_io_types), str(target))
        made.append(target)
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", choices=sorted(DEFAULT_LAYERS))
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("/tmp/fp16big"))
    parser.add_argument("--half", action="store_true", help="also export model.half()")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        layers = args.layers or DEFAULT_LAYERS[name]
        for made in convert(export(name, layers, args.out, half=False)):
            print(made, flush=True)
        if args.half:
            print(export(name, layers, args.out, half=True), flush=True)


if __name__ == "__main__":
    main()
