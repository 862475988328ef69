"""The zoo table: our optimizer next to onnxruntime's session and its transformers optimizer on every model
of the fixture zoo (tools/make_zoo.py), per fused-op family, with nodes after, time and numerics.

    .venv/bin/python tools/zoo_table.py                      # every model in var/zoo/
    .venv/bin/python tools/zoo_table.py --only llama phi --json var/zoo/table.json

For each model:
  - fused ops per family in the optimized graph (what the graph runs, whoever put it there: ours at
    extended and all; onnxruntime's CPU session at ORT_ENABLE_EXTENDED and ORT_ENABLE_ALL, read from
    the graph it writes to optimized_model_filepath; onnxruntime.transformers.optimizer.optimize_model
    with the model type that fits the architecture and its own default opt_level);
  - nodes after at each of those;
  - time: our optimizer's (its report's total), onnxruntime's session creation (optimization and
    kernel creation together: its optimizer is not timed apart), the transformers optimizer's wall time;
  - numerics: our executor at disabled, basic, extended and all, and onnxruntime's session at extended
    and all, each on the saved inputs (right- and left-padded batches) against onnxruntime with every
    optimization off; fp32 tolerance rtol 1e-3, atol 1e-4; a NaN or inf where the reference has none is
    always a difference.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from make_zoo import ZOO_DIR, load_inputs  # noqa: E402

import runtime  # noqa: E402
from optimizer import optimize  # noqa: E402

OUR_LEVELS = ("disabled", "basic", "extended", "all")
ORT_LEVELS = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
RTOL, ATOL = 1e-3, 1e-4

# Fused-op families, by op type (any domain): the ops a fusion puts in a graph.
FAMILIES = {
    "Attention": ("Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
                  "PackedMultiHeadAttention", "DecoderMaskedMultiHeadAttention"),
    "LayerNorm": ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"),
    "SkipLayerNorm": ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"),
    "EmbedLayerNorm": ("EmbedLayerNormalization",),
    "Gelu": ("Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasSplitGelu"),
    "Rotary": ("RotaryEmbedding",),
    "Gemm": ("Gemm", "FusedGemm", "FusedMatMul", "MatMulAddFusion"),
    "Conv": ("FusedConv", "NhwcFusedConv"),
    "BiasAdd": ("BiasAdd", "BiasSoftmax", "BiasDropout"),
}
# A family onnxruntime fuses that ours absorbs into a larger fused op counts as covered by it: a
# LayerNormalization inside SkipLayerNormalization or EmbedLayerNormalization, a MatMul's bias Add
# (onnxruntime's Gemm) inside Attention's projection, SkipLayerNorm's bias or BiasGelu.
COVERED_BY = {"LayerNorm": ("LayerNorm", "SkipLayerNorm", "EmbedLayerNorm"),
              # onnxruntime makes the embedding sum's LayerNorm a SkipLayerNorm where ours fuses the lookups too
              "SkipLayerNorm": ("SkipLayerNorm", "EmbedLayerNorm"),
              "Gemm": ("Gemm", "Attention", "SkipLayerNorm", "Gelu")}
FAMILY_OF = {op: family for family, ops in FAMILIES.items() for op in ops}
SHORT = {"Attention": "Attn", "LayerNorm": "LN", "SkipLayerNorm": "SkipLN", "EmbedLayerNorm": "EmbLN",
         "Gelu": "Gelu", "Rotary": "Rot", "Gemm": "Gemm", "Conv": "Conv", "BiasAdd": "Bias"}

# onnxruntime's transformers optimizer model type per zoo architecture (bert where none fits better).
TRANSFORMERS_TYPE = {"gpt2": "gpt2", "gpt_neox": "gpt_neox", "opt": "gpt2", "bloom": "gpt2", "falcon": "gpt2",
                     "phi": "gpt2", "qwen3": "qwen3", "t5_encoder": "t5", "bart_encoder": "bart", "vit": "vit",
                     "swin": "swin", "llama": "gpt2", "mistral": "gpt2", "qwen2": "gpt2", "phi3": "gpt2",
                     "gemma": "gpt2", "stablelm": "gpt2"}


def families(graph: onnx.GraphProto) -> dict[str, int]:
    counts = Counter(FAMILY_OF[node.op_type] for node in graph.node if node.op_type in FAMILY_OF)
    return dict(sorted(counts.items()))


def _ort_session(path: Path, level: str, folder: Path) -> tuple[ort.InferenceSession, onnx.ModelProto, float]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ORT_LEVELS[level]
    options.log_severity_level = 3
    options.optimized_model_filepath = str(folder / f"ort_{level}.onnx")
    started = time.perf_counter()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ms = (time.perf_counter() - started) * 1000
    return session, onnx.load(options.optimized_model_filepath), ms


def _transformers_optimizer(path: Path, architecture: str) -> dict:
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = TRANSFORMERS_TYPE.get(architecture, "bert")
    started = time.perf_counter()
    try:
        optimized = optimize_model(str(path), model_type=model_type, num_heads=0, hidden_size=0)
    except Exception as error:  # noqa: BLE001 - its failure on a model is a cell of the table
        return {"model_type": model_type, "error": f"{type(error).__name__}: {str(error)[:150]}"}
    ms = (time.perf_counter() - started) * 1000
    graph = optimized.model.graph
    return {"model_type": model_type, "families": families(graph), "nodes": len(graph.node), "ms": round(ms, 1)}


def _difference(got: list, expected: list) -> str | None:
    for ours, theirs in zip(got, expected, strict=True):
        ours, theirs = np.asarray(ours), np.asarray(theirs)
        if ours.shape != theirs.shape:
            return f"shape {list(ours.shape)} vs {list(theirs.shape)}"
        bad = ~np.isfinite(ours) & np.isfinite(theirs)
        if bad.any():
            return f"{int(bad.sum())} NaN/inf"
        if not np.allclose(ours, theirs, rtol=RTOL, atol=ATOL, equal_nan=True):
            finite = np.isfinite(theirs)
            return f"max diff {float(np.max(np.abs(ours[finite] - theirs[finite]))):.2g}"
    return None


def table_row(path: Path, architecture: str) -> dict:
    variants = load_inputs(path)
    row: dict = {"model": path.stem, "architecture": architecture, "ours": {}, "onnxruntime": {}, "numerics": {}}
    for level in ("extended", "all"):
        try:
            report = optimize(str(path), level).report
        except Exception as error:  # noqa: BLE001 - our optimizer failing on a model is the table's news
            row["ours"][level] = {"families": {}, "nodes": f"raises {type(error).__name__}: {str(error)[:80]}",
                                  "ms": float("nan")}
            continue
        row["ours"][level] = {"families": families_of_report(report.ops_after), "nodes": report.nodes_after,
                              "ms": round(report.total_ms, 1)}
    with tempfile.TemporaryDirectory(prefix="fusionwatch-zoo-") as name:
        sessions = {}
        for level in ORT_LEVELS:
            session, optimized, ms = _ort_session(path, level, Path(name))
            sessions[level] = session
            row["onnxruntime"][level] = {"families": families(optimized.graph), "nodes": len(optimized.graph.node),
                                         "session_ms": round(ms, 1)}
        expected = {v: sessions["disabled"].run(None, feeds) for v, feeds in variants.items()}
        for level in ("extended", "all"):
            for variant, feeds in variants.items():
                why = _difference(sessions[level].run(None, feeds), expected[variant])
                row["numerics"][f"onnxruntime {level} {variant}"] = why
    for level in OUR_LEVELS:
        try:
            session = runtime.InferenceSession(str(path), runtime.SessionOptions(graph_optimization_level=level))
        except Exception as error:  # noqa: BLE001 - a refusal is a cell of the table
            row["numerics"][f"ours {level}"] = f"refused: {type(error).__name__}: {str(error)[:120]}"
            continue
        for variant, feeds in variants.items():
            try:
                got = session.run(None, feeds)
            except Exception as error:  # noqa: BLE001
                row["numerics"][f"ours {level} {variant}"] = f"raised {type(error).__name__}: {str(error)[:120]}"
                continue
            row["numerics"][f"ours {level} {variant}"] = _difference(got, expected[variant])
    row["transformers"] = _transformers_optimizer(path, architecture)
    return row


def families_of_report(ops_after: dict[str, int]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for key, n in ops_after.items():
        family = FAMILY_OF.get(key.rsplit(".", 1)[-1])
        if family:
            counts[family] += n
    return dict(sorted(counts.items()))


def fewer_than(ours: dict[str, int], theirs: dict[str, int]) -> list[str]:
    """The families `theirs` has more of than `ours` covers (COVERED_BY)."""
    return [family for family, n in theirs.items()
            if sum(ours.get(f, 0) for f in COVERED_BY.get(family, (family,))) < n]


def _cell(found: dict[str, int], against: dict[str, int] | None = None) -> str:
    """Families as 'Attn 2, LN 5'; a family the other column has more of than this one covers: in bold."""
    if not found and not against:
        return "—"
    short = fewer_than(found, against or {})
    parts = []
    for family in sorted(set(found) | set(short)):
        text = f"{SHORT[family]} {found.get(family, 0)}"
        parts.append(f"**{text}**" if family in short else text)
    return ", ".join(parts)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | ours extended | onnxruntime extended | transformers optimizer | nodes: ours ext / all "
        "| nodes: onnxruntime ext / all | ms: ours ext / ort session ext / transformers | numerics |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ours, theirs, tf = row["ours"], row["onnxruntime"], row["transformers"]
        tf_cell = tf.get("error") or _cell(tf["families"])
        differs = [f"{key}: {why}" for key, why in row["numerics"].items() if why]
        lines.append(
            f"| {row['model']} | {_cell(ours['extended']['families'], theirs['extended']['families'])} "
            f"| {_cell(theirs['extended']['families'])} | {tf_cell} "
            f"| {ours['extended']['nodes']} / {ours['all']['nodes']} "
            f"| {theirs['extended']['nodes']} / {theirs['all']['nodes']} "
            f"| {ours['extended']['ms']:.0f} / {theirs['extended']['session_ms']:.0f} / {tf.get('ms', '—')} "
            f"| {'; '.join(differs) if differs else 'match'} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    fewer_fused = [r["model"] for r in rows if fewer_than(r["ours"]["extended"]["families"],
                                                          r["onnxruntime"]["extended"]["families"])]
    more_nodes = {level: [r["model"] for r in rows if not isinstance(r["ours"][level]["nodes"], int)
                          or r["ours"][level]["nodes"] > r["onnxruntime"][level]["nodes"]]
                  for level in ("extended", "all")}
    wrong = [r["model"] for r in rows if any(why for key, why in r["numerics"].items() if key.startswith("ours"))]
    return "\n".join([
        f"{len(rows)} models. Ours fuses fewer of a family than onnxruntime's session (extended): "
        f"{len(fewer_fused)} ({', '.join(fewer_fused) or 'none'}).",
        f"Ours leaves more nodes than onnxruntime's session: extended {len(more_nodes['extended'])} "
        f"({', '.join(more_nodes['extended']) or 'none'}); all {len(more_nodes['all'])} "
        f"({', '.join(more_nodes['all']) or 'none'}).",
        f"Ours differs from onnxruntime (optimizations off) at some level: {len(wrong)} ({', '.join(wrong) or 'none'}).",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, default=ZOO_DIR)
    parser.add_argument("--only", nargs="*", help="architecture names")
    parser.add_argument("--json", type=Path, help="write every row here too")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    manifest = json.loads((args.zoo / "manifest.json").read_text())
    rows = []
    for stem, entry in sorted(manifest.items()):
        if entry["status"] != "ok" or (args.only and entry["architecture"] not in args.only):
            continue
        rows.append(table_row(args.zoo / f"{stem}.onnx", entry["architecture"]))
        print(f"{stem} done", file=sys.stderr, flush=True)
    failed = {stem: e["error"] for stem, e in sorted(manifest.items()) if e["status"] != "ok"}
    print(markdown(rows))
    print()
    print(summary(rows))
    if failed:
        print("\nNot exported: " + "; ".join(f"{stem}: {why[:160]}" for stem, why in failed.items()))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
