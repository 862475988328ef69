"""Tiny random Hugging Face models exported as Optimum users export them (docs/conformance.md,
"Optimum exports, held out"). Run it with a separate environment that has Optimum, never .venv:

    python3 -m venv /tmp/optvenv && /tmp/optvenv/bin/pip install "optimum[onnx]" onnxruntime torch
    /tmp/optvenv/bin/python tools/export_optimum.py /tmp/heldout [JOB ...]

Each model has hidden size 32 and 2 layers, a vocabulary of 1000; biases and norm weights are drawn
away from 0 and 1 so a fusion that drops one shows in the outputs. Jobs cover feature-extraction
encoders at opsets 14/17/20, decoders with past (text-generation-with-past) at opsets 14 and 18 and
in float16, BART's encoder/decoder with and without the merged decoder (an If), and Optimum's own
ORTOptimizer outputs (O2, O3: graphs already fused with com.microsoft ops) given to us again.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers as tf
from optimum.exporters.onnx import main_export

SMALL = {"vocab_size": 1000, "max_position_embeddings": 64}
CONFIGS = {
    "bert": (lambda: tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                   **SMALL), tf.BertModel),
    "distilbert": (lambda: tf.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, **SMALL), tf.DistilBertModel),
    "gpt2": (lambda: tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=1000), tf.GPT2LMHeadModel),
    "llama": (lambda: tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=64, **SMALL), tf.LlamaForCausalLM),
    "qwen2": (lambda: tf.Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=64, **SMALL), tf.Qwen2ForCausalLM),
    "bart": (lambda: tf.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                   decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, **SMALL),
             tf.BartForConditionalGeneration),
}
WITH_PAST = "text-generation-with-past"
JOBS = {  # output folder: (model, task, main_export's options)
    "bert_fe_op14": ("bert", "feature-extraction", {"opset": 14}),
    "bert_fe_op17": ("bert", "feature-extraction", {"opset": 17}),
    "bert_fe_op20": ("bert", "feature-extraction", {"opset": 20}),
    "distilbert_fe": ("distilbert", "feature-extraction", {}),
    "gpt2_nopast": ("gpt2", "text-generation", {}),
    "gpt2_past": ("gpt2", WITH_PAST, {}),
    "gpt2_past_op14": ("gpt2", WITH_PAST, {"opset": 14}),
    "gpt2_past_op18": ("gpt2", WITH_PAST, {"opset": 18}),
    "llama_past": ("llama", WITH_PAST, {}),
    "llama_past_op14": ("llama", WITH_PAST, {"opset": 14}),
    "llama_past_fp16": ("llama", WITH_PAST, {"dtype": "fp16"}),
    "qwen2_past": ("qwen2", WITH_PAST, {}),
    "bart_past": ("bart", "text2text-generation-with-past", {}),
    "bart_past_nopost": ("bart", "text2text-generation-with-past", {"no_post_process": True}),
    "bert_fe_O2": ("bert", "feature-extraction", {"optimize": "O2"}),
    "bert_fe_O3": ("bert", "feature-extraction", {"optimize": "O3"}),
    "gpt2_past_O2": ("gpt2", WITH_PAST, {"optimize": "O2"}),
    "gpt2_past_O3": ("gpt2", WITH_PAST, {"optimize": "O3"}),
    "llama_past_O2": ("llama", WITH_PAST, {"optimize": "O2"}),
}


def source(out: Path, name: str) -> Path:
    """The random model saved where main_export reads a checkpoint from (made once per folder)."""
    path = out / "src" / name
    if not path.exists():
        config, model_class = CONFIGS[name]
        torch.manual_seed(0)
        model = model_class(config()).eval()
        with torch.no_grad():
            for key, parameter in model.named_parameters():
                if key.endswith("bias"):
                    parameter.copy_(torch.randn_like(parameter) * 0.1)
                elif parameter.dim() == 1 and ("norm" in key.lower() or "ln" in key.lower()):
                    parameter.copy_(1 + torch.randn_like(parameter) * 0.2)
        model.save_pretrained(path)
    return path


def main() -> None:
    out = Path(sys.argv[1])
    for job in sys.argv[2:] or JOBS:
        name, task, options = JOBS[job]
        if not (out / job).exists():
            main_export(str(source(out, name)), out / job, task=task, do_validation=False, **options)
        print(job, sorted(p.name for p in (out / job).glob("*.onnx")))


if __name__ == "__main__":
    main()
