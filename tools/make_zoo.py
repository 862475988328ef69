"""The fixture zoo: tiny random-initialized transformers models of many architectures, each exported by
both of torch's ONNX exporters, with the inputs to run them on saved next to each model.

    .venv/bin/python tools/make_zoo.py                 # every architecture, into var/zoo/ (`make fixtures`)
    .venv/bin/python tools/make_zoo.py --only llama phi --exporters dynamo
    .venv/bin/python tools/make_zoo.py --retry-failed  # models whose export failed last time

For each architecture and exporter (TorchScript: torch.onnx.export dynamo=False; dynamo: dynamo=True)
it writes `var/zoo/<arch>_<exporter>.onnx` and `<arch>_<exporter>.npz`, the inputs by variant:
text models a batch of two whose second row is padded on the right (`right/<input>`) and on the left
(`left/<input>`, as batched generation pads); vision and audio models one `images/<input>` batch.
`var/zoo/manifest.json` records, per model, whether it exported, why not when it did not, how long it
took and how far onnxruntime's outputs are from PyTorch's on each variant. Models already made (or
already failed) are skipped: exports on a shared machine take minutes, so the zoo is made once and
kept. Everything here is generated (var/ is not in git); the tests that need a model of the zoo
skip when it has not been made, and the few small models the tests pin live in tests/models/.

Weights are re-randomized after the architecture's own initialization: transformers starts biases at 0,
norms at the identity and batch-norm statistics at 0/1, where a fusion that drops one of them would still
match; see `rerandomize`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_fixtures import export_onnx  # noqa: E402

ZOO_DIR = REPO / "var" / "zoo"
EXPORTERS = ("torchscript", "dynamo")
SEED = 0
BATCH, SEQ, VOCAB, IMAGE = 2, 16, 1000, 32
PADDED = 3  # tokens of padding in the second row
# One size for every text model: 2 layers, width 64, 4 heads (of 16), a 128-wide MLP.
TEXT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            vocab_size=VOCAB, max_position_embeddings=64)
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


@dataclass
class Architecture:
    """How to build one architecture and what it takes: `build` returns the bare transformers model."""

    name: str
    build: Callable[[], nn.Module]
    inputs: list[str]
    outputs: list[str] = field(default_factory=lambda: ["last_hidden_state"])
    kind: str = "text"  # text: token ids and a mask; vision: pixel_values; audio: input_features


def _config(name: str, **values):
    import transformers

    return getattr(transformers, name)(**values)


def _model(name: str, config) -> nn.Module:
    import transformers

    return getattr(transformers, name)(config)


def _text(model_class: str, config_class: str, inputs=("input_ids", "attention_mask"), outputs=None, **overrides):
    def build():
        return _model(model_class, _config(config_class, **{**TEXT, **overrides}))
    return build, list(inputs), outputs or ["last_hidden_state"]


def _arch(name, spec, **kwargs) -> Architecture:
    build, inputs, outputs = spec
    return Architecture(name, build, inputs, outputs, **kwargs)


def _encoder_half(model_class: str, config_class: str, **values):
    """The encoder of a sequence-to-sequence model, as exporters of those models split it."""
    def build():
        return _model(model_class, _config(config_class, **values)).get_encoder()
    return build


BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DECODER = dict(**TOKENS, use_cache=False)

ARCHITECTURES: list[Architecture] = [
    # --- encoders ---------------------------------------------------------------------------
    _arch("bert", _text("BertModel", "BertConfig", BERT_INPUTS)),
    _arch("roberta", _text("RobertaModel", "RobertaConfig", max_position_embeddings=66, **TOKENS)),
    _arch("albert", _text("AlbertModel", "AlbertConfig", BERT_INPUTS, embedding_size=32)),
    _arch("distilbert", _text("DistilBertModel", "DistilBertConfig", dim=64, n_layers=2, n_heads=4, hidden_dim=128)),
    _arch("deberta_v2", _text("DebertaV2Model", "DebertaV2Config", position_buckets=8, max_relative_positions=16)),
    _arch("mpnet", _text("MPNetModel", "MPNetConfig", max_position_embeddings=66, **TOKENS)),
    _arch("modernbert", _text("ModernBertModel", "ModernBertConfig", local_attention=8, **TOKENS,
                              cls_token_id=3, sep_token_id=4)),
    _arch("electra", _text("ElectraModel", "ElectraConfig", BERT_INPUTS, embedding_size=32)),
    # --- decoders: learned positions, rotary, ALiBi, multi-query and grouped-query attention ---
    _arch("gpt2", _text("GPT2Model", "GPT2Config", n_embd=64, n_layer=2, n_head=4, n_inner=128, n_positions=64,
                        **DECODER)),
    _arch("gpt_neox", _text("GPTNeoXModel", "GPTNeoXConfig", **DECODER)),
    _arch("opt", _text("OPTModel", "OPTConfig", ffn_dim=128, word_embed_proj_dim=64, **DECODER)),
    _arch("llama", _text("LlamaModel", "LlamaConfig", num_key_value_heads=2, **DECODER)),
    _arch("mistral", _text("MistralModel", "MistralConfig", num_key_value_heads=2, sliding_window=None, **DECODER)),
    _arch("qwen2", _text("Qwen2Model", "Qwen2Config", num_key_value_heads=2, **DECODER)),
    _arch("qwen3", _text("Qwen3Model", "Qwen3Config", num_key_value_heads=2, head_dim=16, **DECODER)),
    _arch("phi", _text("PhiModel", "PhiConfig", **DECODER)),
    _arch("phi3", _text("Phi3Model", "Phi3Config", num_key_value_heads=2, **DECODER)),
    _arch("gemma", _text("GemmaModel", "GemmaConfig", num_key_value_heads=1, head_dim=16, **DECODER)),
    _arch("stablelm", _text("StableLmModel", "StableLmConfig", num_key_value_heads=2, **DECODER)),
    _arch("falcon", _text("FalconModel", "FalconConfig", multi_query=True, **DECODER)),
    _arch("bloom", _text("BloomModel", "BloomConfig", n_layer=2, n_head=4, **DECODER)),
    # --- encoder halves of sequence-to-sequence models ------------------------------------------
    _arch("t5_encoder", _text("T5EncoderModel", "T5Config", d_model=64, d_kv=16, d_ff=128, num_layers=2,
                              num_heads=4, feed_forward_proj="relu", **TOKENS)),
    Architecture("bart_encoder", _encoder_half("BartModel", "BartConfig", vocab_size=VOCAB, d_model=64,
                                               encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                               max_position_embeddings=64, **TOKENS),
                 ["input_ids", "attention_mask"]),
    Architecture("whisper_encoder", _encoder_half("WhisperModel", "WhisperConfig", vocab_size=VOCAB, num_mel_bins=16,
                                                  d_model=64, encoder_layers=2, decoder_layers=2,
                                                  encoder_attention_heads=4, decoder_attention_heads=4,
                                                  encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=16,
                                                  max_target_positions=16, **TOKENS, decoder_start_token_id=1),
                 ["input_features"], kind="audio"),
    # --- vision ------------------------------------------------------------------------------
    Architecture("vit", lambda: _model("ViTModel", _config(
        "ViTConfig", image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128)), ["pixel_values"], ["last_hidden_state", "pooler_output"], kind="vision"),
    Architecture("swin", lambda: _model("SwinModel", _config(
        "SwinConfig", image_size=IMAGE, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4)),
        ["pixel_values"], ["last_hidden_state", "pooler_output"], kind="vision"),
    Architecture("convnext", lambda: _model("ConvNextModel", _config(
        "ConvNextConfig", image_size=IMAGE, depths=[1, 1], hidden_sizes=[16, 32], num_stages=2)),
        ["pixel_values"], ["last_hidden_state", "pooler_output"], kind="vision"),
    Architecture("mobilenet_v2", lambda: _model("MobileNetV2Model", _config(
        "MobileNetV2Config", image_size=IMAGE, depth_multiplier=0.35)),
        ["pixel_values"], ["last_hidden_state", "pooler_output"], kind="vision"),
    Architecture("efficientnet", lambda: _model("EfficientNetModel", _config(
        "EfficientNetConfig", image_size=IMAGE, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320)),
        ["pixel_values"], ["last_hidden_state", "pooler_output"], kind="vision"),
]


class Positional(nn.Module):
    """Tensors in by position, a tuple of tensors out: what both exporters take and give."""

    def __init__(self, model: nn.Module, inputs: list[str], outputs: list[str]):
        super().__init__()
        self.model, self.names, self.outputs = model, inputs, outputs

    def forward(self, *tensors: torch.Tensor):
        out = self.model(**dict(zip(self.names, tensors, strict=True)), return_dict=True)
        return tuple(getattr(out, name) for name in self.outputs)


@torch.no_grad()
def rerandomize(model: nn.Module, seed: int = SEED) -> None:
    """Seeded noise on every weight, larger on one-dimensional ones (biases, norm scales and shifts),
    and batch-norm statistics away from 0/1, so that every term of every fused op matters."""
    generator = torch.Generator().manual_seed(seed + 1)
    for parameter in model.parameters():
        scale = 0.1 if parameter.dim() == 1 else 0.02
        parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
            module.running_mean.add_(torch.randn(module.num_features, generator=generator) * 0.1)
            module.running_var.mul_(torch.rand(module.num_features, generator=generator) + 0.5)


def example_inputs(arch: Architecture) -> dict[str, dict[str, np.ndarray]]:
    """Inputs by variant ("right", "left" for text; "images" otherwise), each a batch of two."""
    generator = np.random.default_rng(SEED)
    if arch.kind == "vision":
        return {"images": {"pixel_values": generator.standard_normal((BATCH, 3, IMAGE, IMAGE), np.float32)}}
    if arch.kind == "audio":
        return {"images": {"input_features": generator.standard_normal((BATCH, 16, 32), np.float32)}}
    ids = generator.integers(5, VOCAB, (BATCH, SEQ), dtype=np.int64)  # clear of pad/bos/eos/cls/sep
    variants = {}
    for variant in ("right", "left"):
        mask = np.ones((BATCH, SEQ), np.int64)
        if variant == "right":
            mask[1, SEQ - PADDED:] = 0
        else:
            mask[1, :PADDED] = 0
        types = np.zeros((BATCH, SEQ), np.int64)
        types[:, SEQ // 2:] = 1
        feeds = {"input_ids": ids.copy(), "attention_mask": mask, "token_type_ids": types}
        variants[variant] = {name: feeds[name] for name in arch.inputs}
    return variants


def _dynamic_axes(arch: Architecture) -> dict[str, dict[int, str]]:
    axes = {name: {0: "batch"} for name in arch.inputs + arch.outputs}
    if arch.kind == "text":
        for name in arch.inputs:
            axes[name][1] = "seq"
        axes["last_hidden_state"][1] = "seq"
    return axes


def _worst_error(model: nn.Module, path: Path, variants: dict) -> dict[str, float | str]:
    """Per variant: onnxruntime's largest difference from PyTorch, relative to the output's size."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    errors: dict[str, float | str] = {}
    for variant, feeds in variants.items():
        with torch.no_grad():
            expected = model(*(torch.from_numpy(feeds[name]) for name in model.names))
        got = session.run(None, feeds)
        worst = 0.0
        for ours, theirs in zip(got, expected, strict=True):
            theirs = theirs.numpy()
            if ours.shape != theirs.shape:
                errors[variant] = f"shape {list(ours.shape)} against torch {list(theirs.shape)}"
                break
            finite = np.isfinite(theirs)
            if not np.array_equal(finite, np.isfinite(ours)):
                errors[variant] = "non-finite values where torch has none (or the reverse)"
                break
            scale = max(1.0, float(np.max(np.abs(theirs[finite]), initial=0.0)))
            worst = max(worst, float(np.max(np.abs(ours[finite] - theirs[finite]), initial=0.0)) / scale)
        errors.setdefault(variant, worst)
    return errors


def make_one(arch: Architecture, exporter: str, folder: Path, opset: int) -> dict:
    stem = f"{arch.name}_{exporter}"
    torch.manual_seed(SEED)
    model = Positional(arch.build().eval(), arch.inputs, arch.outputs).eval()
    rerandomize(model)
    variants = example_inputs(arch)
    first = next(iter(variants.values()))
    args = tuple(torch.from_numpy(first[name]) for name in arch.inputs)
    started = time.perf_counter()
    export_onnx(model, args, folder / f"{stem}.onnx", exporter=exporter, opset=opset, input_names=arch.inputs,
                output_names=arch.outputs, dynamic_axes=_dynamic_axes(arch))
    seconds = time.perf_counter() - started
    np.savez(folder / f"{stem}.npz", **{f"{v}/{n}": a for v, feeds in variants.items() for n, a in feeds.items()})
    return {"status": "ok", "seconds": round(seconds, 1), "opset": opset,
            "error_vs_torch": _worst_error(model, folder / f"{stem}.onnx", variants)}


def load_inputs(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """A zoo model's saved inputs by variant (the .npz next to `path`)."""
    variants: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path.with_suffix(".npz")) as saved:
        for key in saved.files:
            variant, name = key.split("/", 1)
            variants.setdefault(variant, {})[name] = saved[key]
    return variants


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ZOO_DIR)
    parser.add_argument("--only", nargs="*", help="architecture names (default: all)")
    parser.add_argument("--exporters", nargs="*", default=list(EXPORTERS), choices=EXPORTERS)
    parser.add_argument("--retry-failed", action="store_true")
    # TorchScript's highest; dynamo exports at 18 as torch's default does.
    parser.add_argument("--opset", type=int, default=None, help="default: 17 for TorchScript, 18 for dynamo")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    wanted = [a for a in ARCHITECTURES if not args.only or a.name in args.only]
    for arch in wanted:
        for exporter in args.exporters:
            stem = f"{arch.name}_{exporter}"
            known = manifest.get(stem, {}).get("status")
            if known == "ok" and (args.out / f"{stem}.onnx").exists():
                continue
            if known == "failed" and not args.retry_failed:
                continue
            opset = args.opset or (17 if exporter == "torchscript" else 18)
            try:
                manifest[stem] = {"architecture": arch.name, "exporter": exporter, **make_one(arch, exporter,
                                                                                              args.out, opset)}
            except Exception as error:  # noqa: BLE001 - a model that does not export is a row, not the end
                (args.out / f"{stem}.onnx").unlink(missing_ok=True)
                manifest[stem] = {"architecture": arch.name, "exporter": exporter, "status": "failed",
                                  "error": f"{type(error).__name__}: {str(error)[:500]}",
                                  "where": traceback.format_exc(limit=-3)[-1500:]}
            print(f"{stem}: {manifest[stem]['status']} {manifest[stem].get('error', '')[:200]}", flush=True)
            manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    made = sum(entry["status"] == "ok" for entry in manifest.values())
    print(f"{made} of {len(manifest)} models in {args.out}")


if __name__ == "__main__":
    main()
