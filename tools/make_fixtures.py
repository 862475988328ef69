"""Export the tiny random-weight ONNX fixtures in tests/models/ (run via `make fixtures`).

The same functions are imported by the benchmark to export full-size BERT-base / GPT-2 small /
ResNet-50, so everything is parameterised; only `main()` knows the fixture sizes.

No pretrained weights are reachable from this machine, so every model is built from a config
with seeded random weights: fusion patterns depend on the graph, not on the weight values.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO / "tests" / "models"
SEED = 0

# Input names per model family; the optimizer/runtime tests feed inputs by these names.
# "bert_notype" and "roberta" are exported the way most users call them, without token_type_ids:
# the token-type embedding then comes from a constant buffer expanded to the batch.
# "gpt2_cache" keeps the config default use_cache=True, so each layer's key/value go through the
# cache (a Concat onto the empty cache) and come out as present_* outputs.
HF_INPUTS = {
    "bert": ["input_ids", "attention_mask", "token_type_ids"],
    "bert_notype": ["input_ids", "attention_mask"],
    "roberta": ["input_ids", "attention_mask"],
    "gpt2": ["input_ids", "attention_mask"],
    "gpt2_cache": ["input_ids", "attention_mask"],
    "distilbert": ["input_ids", "attention_mask"],
    # position_ids as onnxruntime's own Llama export takes them; without them the rotary cos/sin
    # tables are computed for batch 1 and broadcast, which ONNX's RotaryEmbedding-23 does not allow.
    "llama": ["input_ids", "attention_mask", "position_ids"],
}
HF_OUTPUTS = {
    "bert": ["last_hidden_state", "pooler_output"],
    "bert_notype": ["last_hidden_state", "pooler_output"],
    "roberta": ["last_hidden_state", "pooler_output"],
    "gpt2": ["last_hidden_state"],
    "gpt2_cache": ["last_hidden_state"],  # + present_{layer}_{key,value}, named by _hf_output_names
    "distilbert": ["last_hidden_state"],
    "llama": ["last_hidden_state"],
}


def _hf_output_names(kind: str, layers: int) -> list[str]:
    if kind != "gpt2_cache":
        return HF_OUTPUTS[kind]
    return HF_OUTPUTS[kind] + [f"present_{i}_{kv}" for i in range(layers) for kv in ("key", "value")]


class _HFWrapper(nn.Module):
    """Positional-tensor front end for a Hugging Face model.

    The TorchScript exporter passes inputs positionally, and recent transformers signatures no
    longer line up (GPT-2's 2nd positional arg is past_key_values, BERT's forward takes **kwargs),
    so we call by keyword and return a plain tuple (no ModelOutput, no KV cache outputs).
    """

    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.model = model
        self.kind = kind

    def forward(self, *tensors: torch.Tensor):
        kwargs = dict(zip(HF_INPUTS[self.kind], tensors, strict=True))
        if self.kind in ("gpt2", "llama"):
            kwargs["use_cache"] = False  # otherwise present key/values become extra outputs
        if self.kind == "gpt2_cache":
            kwargs["use_cache"] = True
        out = self.model(**kwargs, return_dict=True)
        if self.kind in ("bert", "bert_notype", "roberta"):
            return out.last_hidden_state, out.pooler_output
        if self.kind == "gpt2_cache":
            cache = out.past_key_values
            present = [t for layer in cache.layers for t in (layer.keys, layer.values)]
            return (out.last_hidden_state, *present)
        return out.last_hidden_state


def _build_hf(kind: str, *, layers, hidden, heads, intermediate, vocab, positions,
              attn_implementation, hidden_act: str | None = None):
    # Imported lazily so importing this module (e.g. from the benchmark) stays cheap.
    from transformers import (
        BertConfig,
        BertModel,
        DistilBertConfig,
        DistilBertModel,
        GPT2Config,
        GPT2Model,
        LlamaConfig,
        LlamaModel,
        RobertaConfig,
        RobertaModel,
    )

    torch.manual_seed(SEED)
    if kind in ("bert", "bert_notype"):
        cfg = BertConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            max_position_embeddings=positions,
            hidden_act=hidden_act or "gelu",  # config default: exact erf GELU
            attn_implementation=attn_implementation,
        )
        model = BertModel(cfg)
    elif kind == "roberta":
        cfg = RobertaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            # RoBERTa numbers positions from padding_idx + 1, so the table holds two more rows.
            max_position_embeddings=positions + 2,
            hidden_act="gelu",
            attn_implementation=attn_implementation,
        )
        model = RobertaModel(cfg)
    elif kind == "llama":
        # Llama-style: RMSNorm, rotary embeddings, grouped-query attention (half as many key/value
        # heads as query heads) and a SiLU-gated MLP, no biases.
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            intermediate_size=intermediate,
            max_position_embeddings=positions,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=None,
            attn_implementation=attn_implementation,
        )
        model = LlamaModel(cfg)
    elif kind == "distilbert":
        # No token types and no pooler; its padding mask reaches attention as a (B, 1, S, T) bool
        # through a Where, and the scores' softmax is guarded against NaN (IsNaN, Where).
        cfg = DistilBertConfig(vocab_size=vocab, dim=hidden, n_layers=layers, n_heads=heads, hidden_dim=intermediate,
                               max_position_embeddings=positions, attn_implementation=attn_implementation)
        model = DistilBertModel(cfg)
    elif kind in ("gpt2", "gpt2_cache"):
        cfg = GPT2Config(
            vocab_size=vocab,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_inner=intermediate,
            n_positions=positions,
            bos_token_id=vocab - 1,  # defaults (50256) would lie outside a tiny vocab
            eos_token_id=vocab - 1,
            activation_function="gelu_new",  # config default: tanh-approximate GELU
            attn_implementation=attn_implementation,
        )
        model = GPT2Model(cfg)
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    _perturb(model)
    # eval(): dropout off, so the graph has no Dropout nodes and outputs are deterministic.
    return _HFWrapper(model.eval(), kind).eval()


@torch.no_grad()
def _perturb(model: nn.Module, scale: float = 0.02) -> None:
    """Add seeded noise to every parameter and BatchNorm statistic.

    HF init leaves all biases at 0 and LayerNorm/BatchNorm at identity (gamma 1, beta 0, running
    stats 0/1). A fused kernel that dropped a bias or a LayerNorm gamma would then still match
    the reference, and the TorchScript exporter would dedupe the identical zero tensors into
    one initializer + Identity nodes. Noise makes every weight distinct and every term matter.
    """
    g = torch.Generator().manual_seed(SEED + 1)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g) * scale)
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.running_mean.add_(torch.randn(mod.num_features, generator=g) * 0.1)
            # keep variances positive and away from 0
            mod.running_var.mul_(torch.rand(mod.num_features, generator=g) + 0.5)


def _hf_example_inputs(kind: str, seq: int, vocab: int, batch: int = 1, padded: bool = False):
    """Token ids plus masks; `padded` right-pads the last row and mixes token types.

    The padded variant is used to verify the export: transformers skips building the mask
    when it is all ones, so a trace that baked that shortcut in would only show up there.
    """
    g = torch.Generator().manual_seed(SEED + batch)
    input_ids = torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.int64)
    attention_mask = torch.ones(batch, seq, dtype=torch.int64)
    token_type_ids = torch.zeros(batch, seq, dtype=torch.int64)
    if padded:
        attention_mask[-1, seq - max(1, seq // 4):] = 0
        token_type_ids[:, seq // 2:] = 1
    if kind == "bert":
        return (input_ids, attention_mask, token_type_ids)
    if kind == "llama":
        return (input_ids, attention_mask, torch.arange(seq, dtype=torch.int64).expand(batch, seq).clone())
    if kind == "roberta":
        # RoBERTa's position ids skip padding tokens (id 1 by default); keep them out of the inputs
        # so positions are always 2, 3, ... as in the real model's unpadded text.
        input_ids[input_ids == 1] = 2
    return (input_ids, attention_mask)


def export_onnx(model: nn.Module, args: tuple, path: Path, *, exporter: str, opset: int,
            input_names: list[str], output_names: list[str],
            dynamic_axes: dict[str, dict[int, str]] | None) -> None:
    """Export `model` to a single self-contained .onnx file.

    dynamic_axes uses the TorchScript exporter's {name: {axis: dim_name}} form for both
    exporters; for dynamo it is translated to torch.export Dims (same name -> same Dim).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings are expected and noisy
        if exporter == "torchscript":
            torch.onnx.export(
                model, args, str(path), dynamo=False, opset_version=opset,
                input_names=input_names, output_names=output_names,
                dynamic_axes=dynamic_axes, do_constant_folding=True,
            )
        elif exporter == "dynamo":
            dynamic_shapes = None
            if dynamic_axes:
                dims: dict[str, torch.export.Dim] = {}
                per_input = [
                    {ax: dims.setdefault(d, torch.export.Dim(d)) for ax, d in dynamic_axes.get(n, {}).items()}
                    for n in input_names
                ]
                # One entry per forward() parameter; the wrappers take *tensors, so the
                # per-tensor specs are nested one level inside that single varargs entry.
                dynamic_shapes = (tuple(per_input),)
            # optimize=True is the default (constant folding + onnxscript rewrites); we keep it
            # because that is what users of the exporter get.
            program = torch.onnx.export(
                model, args, dynamo=True, opset_version=opset,
                input_names=input_names, output_names=output_names,
                dynamic_shapes=dynamic_shapes, optimize=True, verbose=False,
            )
            # external_data=False: weights inside the one .onnx file, no side-car .data file.
            program.save(str(path), external_data=False)
        else:
            raise ValueError(f"unknown exporter {exporter!r}")
    m = onnx.load(str(path))
    # The dynamo exporter attaches per-node metadata (Python stack traces with absolute paths,
    # FX node dumps): ~1/4 of a tiny model's bytes and it makes the file depend on where the
    # repo is checked out. It carries no semantics, so drop it for small, reproducible files.
    for node in _all_nodes(m.graph):
        del node.metadata_props[:]
    onnx.save(m, str(path), save_as_external_data=False)


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:  # If/Loop/Scan bodies
            for g in [attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs:
                yield from _all_nodes(g)


def check_against_torch(model: nn.Module, arg_sets: list[tuple], path: Path, input_names: list[str],
                        tol: float = 1e-4) -> float:
    """Run the exported file in onnxruntime on each input set and compare with PyTorch.

    Catches silently wrong exports (e.g. a mask traced as a constant, a batch size baked in).
    Returns the worst error, relative to each output's largest magnitude (floored at 1):
    random-weight ResNet-50 activations reach ~3e4, where float32 reassociation alone gives
    absolute differences of ~0.04.
    """
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    err = 0.0
    for args in arg_sets:
        with torch.no_grad():
            ref = model(*args)
        ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
        got = sess.run(None, {n: a.numpy() for n, a in zip(input_names, args, strict=True)})
        for g, r in zip(got, ref, strict=True):
            r = r.numpy()
            assert g.shape == r.shape, f"{path}: shape {g.shape} != torch {r.shape}"
            err = max(err, float(np.max(np.abs(g - r))) / max(1.0, float(np.max(np.abs(r)))))
    if err > tol:
        raise AssertionError(f"{path}: onnxruntime differs from torch (relative error {err:.2e})")
    return err


def export_hf(kind: str, exporter: str, path, *, layers: int, hidden: int, heads: int,
              intermediate: int, seq: int, vocab: int, attn_implementation: str = "sdpa",
              opset: int, positions: int | None = None, dynamic: bool = True, batch: int = 1,
              verify: bool = True, hidden_act: str | None = None) -> Path:
    """Export a random-weight Hugging Face model of `kind` (a key of HF_INPUTS: "bert" a BertModel,
    "gpt2" a GPT2Model, "distilbert" a DistilBertModel, ...) to ONNX at `path`.

    exporter: "torchscript" (torch.onnx.export dynamo=False) or "dynamo" (dynamo=True).
    positions: size of the position-embedding table; None = the real models' 512 (BERT) /
    1024 (GPT-2). The tiny fixtures pass 64, since a full table would dominate their size.
    dynamic: batch and sequence axes are symbolic ("batch", "seq") in the exported file.
    verify: compare onnxruntime against PyTorch on the example inputs.
    hidden_act: BERT's MLP activation ("gelu_new": the tanh approximation, "quick_gelu":
    x*sigmoid(1.702x)); None keeps the config default.
    """
    if positions is None:
        positions = 512 if kind in ("bert", "bert_notype", "roberta", "distilbert") else 1024
    if seq > positions:
        raise ValueError(f"seq={seq} exceeds the position table ({positions})")
    model = _build_hf(kind, layers=layers, hidden=hidden, heads=heads, intermediate=intermediate,
                      vocab=vocab, positions=positions, attn_implementation=attn_implementation,
                      hidden_act=hidden_act)
    args = _hf_example_inputs(kind, seq, vocab, batch)
    axes = None
    if dynamic:
        axes = {n: {0: "batch", 1: "seq"} for n in HF_INPUTS[kind]}
        axes["last_hidden_state"] = {0: "batch", 1: "seq"}
        if kind in ("bert", "bert_notype", "roberta"):
            axes["pooler_output"] = {0: "batch"}
        for name in _hf_output_names(kind, layers)[1:]:
            if name.startswith("present_"):
                axes[name] = {0: "batch", 2: "seq"}
    path = Path(path)
    export_onnx(model, args, path, exporter=exporter, opset=opset, input_names=HF_INPUTS[kind],
            output_names=_hf_output_names(kind, layers), dynamic_axes=axes)
    if verify:
        # A second, padded input set; with dynamic axes it also uses another batch size.
        other = _hf_example_inputs(kind, seq, vocab, batch + 1 if dynamic else batch, padded=True)
        check_against_torch(model, [args, other], path, HF_INPUTS[kind])
    return path


class _ResNetWrapper(nn.Module):
    """Returns a plain tuple so both exporters see tensors, not a ModelOutput."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor):
        out = self.model(pixel_values=pixel_values, return_dict=True)
        return out.last_hidden_state, out.pooler_output


def export_resnet(path, depth: int = 50, image: int = 224, *, depths=None, hidden_sizes=None,
                  embedding_size: int = 64, opset: int = 17, batch: int = 1,
                  dynamic: bool = True, verify: bool = True) -> Path:
    """Export a random-weight transformers ResNetModel with the TorchScript exporter.

    depth=50 gives the ResNet-50 layout; pass depths/hidden_sizes for a custom (tiny) net.
    torchvision is not available here, which is why this goes through transformers.
    """
    from transformers import ResNetConfig, ResNetModel

    layouts = {  # (layer_type, depths) of the standard ResNets
        18: ("basic", [2, 2, 2, 2]),
        34: ("basic", [3, 4, 6, 3]),
        50: ("bottleneck", [3, 4, 6, 3]),
        101: ("bottleneck", [3, 4, 23, 3]),
        152: ("bottleneck", [3, 8, 36, 3]),
    }
    layer_type, std_depths = layouts[depth]
    if hidden_sizes is None:
        hidden_sizes = [256, 512, 1024, 2048] if layer_type == "bottleneck" else [64, 128, 256, 512]
    torch.manual_seed(SEED)
    cfg = ResNetConfig(
        num_channels=3,
        embedding_size=embedding_size,
        hidden_sizes=list(hidden_sizes),
        depths=list(depths or std_depths),
        layer_type=layer_type,
        hidden_act="relu",
        downsample_in_first_stage=False,
    )
    resnet = ResNetModel(cfg)
    # Identity BatchNorms would make the Conv+BN folding the exporter does a no-op; see _perturb.
    _perturb(resnet)
    model = _ResNetWrapper(resnet.eval()).eval()
    x = torch.randn(batch, 3, image, image, generator=torch.Generator().manual_seed(SEED))
    names = ["pixel_values"]
    # Only the batch is dynamic: image size is fixed by the benchmark, and a static spatial
    # size lets shape inference resolve every Conv output.
    axes = {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"},
            "pooler_output": {0: "batch"}} if dynamic else None
    path = Path(path)
    export_onnx(model, (x,), path, exporter="torchscript", opset=opset, input_names=names,
            output_names=["last_hidden_state", "pooler_output"], dynamic_axes=axes)
    if verify:
        sets = [(x,)]
        if dynamic:
            sets.append((torch.randn(batch + 1, 3, image, image, generator=torch.Generator().manual_seed(SEED + 1)),))
        check_against_torch(model, sets, path, names)
    return path


def pin_input_shapes(source, path, sizes: dict[str, int]) -> Path:
    """Copy of `source` with its symbolic input/output dims fixed (`sizes`: dim name -> size).

    What a user gets from onnxruntime's make_dynamic_shape_fixed, or from any tool that pins
    a dynamic export to batch 1: every graph input and output static, but intermediate shapes
    left for inference to rediscover (the exporter's value_info, written for symbolic dims,
    is dropped, since it would now contradict the inputs).
    """
    model = onnx.load(str(source))
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in sizes:
                size = sizes[dim.dim_param]
                dim.Clear()
                dim.dim_value = size
    del model.graph.value_info[:]
    path = Path(path)
    onnx.save(model, str(path), save_as_external_data=False)
    return path


TINY = dict(layers=2, hidden=64, heads=4, intermediate=256, seq=16, vocab=1000, positions=64)
USER = {**TINY, "intermediate": 128}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=MODELS_DIR)
    a = ap.parse_args(argv)
    out: Path = a.out
    # (file, model, exporter, opset, attention, dynamic batch/seq). The static files are
    # exported at batch 1, sequence 16: there every shape is known, so MatMulAddFusion can
    # turn rank-3 projections into Gemm (the ONNX Runtime 1.31 regression shows only there).
    jobs = [
        ("bert_torchscript_opset14.onnx", "bert", "torchscript", 14, "sdpa", True),
        ("bert_dynamo_opset20.onnx", "bert", "dynamo", 20, "sdpa", True),
        ("gpt2_torchscript_opset14.onnx", "gpt2", "torchscript", 14, "sdpa", True),
        ("gpt2_dynamo_opset20.onnx", "gpt2", "dynamo", 20, "sdpa", True),
        ("bert_eager_torchscript_opset14.onnx", "bert", "torchscript", 14, "eager", True),
        ("bert_static_torchscript_opset14.onnx", "bert", "torchscript", 14, "sdpa", False),
        ("bert_static_dynamo_opset20.onnx", "bert", "dynamo", 20, "sdpa", False),
    ]
    for name, kind, exporter, opset, attn, dynamic in jobs:
        export_hf(kind, exporter, out / name, attn_implementation=attn, opset=opset, dynamic=dynamic, **TINY)
        print(f"wrote {out / name} ({os.path.getsize(out / name)} bytes)")
    # Exported as users export these models, not as the fixtures above were shaped for the
    # optimizer: BERT/RoBERTa without token_type_ids, GPT-2 with its key/value cache, a Llama-style
    # model, and opset 23, where the dynamo exporter emits Attention, RMSNormalization and
    # RotaryEmbedding itself. A narrower MLP keeps each file near 600 KB.
    user_jobs = [
        ("bert_notype_torchscript_opset14.onnx", "bert_notype", "torchscript", 14),
        ("roberta_notype_torchscript_opset14.onnx", "roberta", "torchscript", 14),
        ("gpt2_cache_torchscript_opset14.onnx", "gpt2_cache", "torchscript", 14),
        ("llama_torchscript_opset14.onnx", "llama", "torchscript", 14),
        ("llama_dynamo_opset20.onnx", "llama", "dynamo", 20),
        ("llama_dynamo_opset23.onnx", "llama", "dynamo", 23),
        ("bert_dynamo_opset23.onnx", "bert", "dynamo", 23),
        ("gpt2_dynamo_opset23.onnx", "gpt2", "dynamo", 23),
    ]
    for name, kind, exporter, opset in user_jobs:
        export_hf(kind, exporter, out / name, opset=opset, **USER)
        print(f"wrote {out / name} ({os.path.getsize(out / name)} bytes)")
    # The BERT of bert_torchscript_opset14.onnx as a model repository changes it (the alerts'
    # tests, docs/alerts.md): another exporter opset, where LayerNormalization is written by the
    # exporter instead of fused, and the MLP's GELU rewritten as the tanh approximation and as
    # x*sigmoid(1.702x), where BiasGeluFusion no longer fires.
    variant_jobs = [
        ("bert_torchscript_opset17.onnx", 17, None),
        ("bert_tanhgelu_torchscript_opset14.onnx", 14, "gelu_new"),
        ("bert_quickgelu_torchscript_opset14.onnx", 14, "quick_gelu"),
    ]
    for name, opset, act in variant_jobs:
        export_hf("bert", "torchscript", out / name, opset=opset, hidden_act=act, **TINY)
        print(f"wrote {out / name} ({os.path.getsize(out / name)} bytes)")
    # The dynamic dynamo export pinned to batch 1 afterwards: unlike a static export, its shape
    # arithmetic stays in the graph, so shape inference alone names the batch `unk__N`.
    pinned = pin_input_shapes(out / "bert_dynamo_opset20.onnx", out / "bert_pinned_dynamo_opset20.onnx",
                              {"batch": 1, "seq": TINY["seq"]})
    print(f"wrote {pinned} ({os.path.getsize(pinned)} bytes)")
    tiny_resnet = out / "resnet_tiny_opset17.onnx"
    export_resnet(tiny_resnet, depth=50, image=32, depths=[1, 1], hidden_sizes=[16, 32],
                  embedding_size=8)
    print(f"wrote {tiny_resnet} ({os.path.getsize(tiny_resnet)} bytes)")
    # Keep the op inventory (read by the optimizer engineers, checked by tests) in sync.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from inventory import describe

    text = "\n\n".join(describe(p) for p in sorted(out.glob("*.onnx"))) + "\n"
    (out / "INVENTORY.txt").write_text(text)
    print(f"wrote {out / 'INVENTORY.txt'}")


if __name__ == "__main__":
    main()
