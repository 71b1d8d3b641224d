"""The model configurations the real-sglang run serves with random weights (``--load-format dummy``).

No model hub is reachable from the GPU machine, so each model is a ``config.json`` written here; the
weights are sglang's dummy initialisation. The attention and KV shapes are those of the named
models; layer counts are cut where the run only needs the layout (correctness) and kept where the
cost depends on them (the Llama-3-8B cost model keeps all 32 layers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# The tokenizer written beside a model for the HTTP server and sglang's bench_serving: a word-level
# vocabulary "t0".."t{V-1}" split on whitespace, so any token ids decode to a text that encodes back to
# the same ids (a prompt of N random ids is N tokens to the server, as bench_serving's random-ids
# dataset assumes), with no special tokens added.
TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 16384,
                    "unk_token": "t0"}

# Llama-3-8B: 32 query heads, 8 KV heads of 128, 128,256-token vocabulary.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# Llama-3.2-1B: 32 query heads, 8 KV heads of 64, 16 layers, tied embeddings (plain rope: the weights are random).
LLAMA32_1B = {**LLAMA3_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
              "head_dim": 64, "tie_word_embeddings": True}

# DeepSeek-V2-Lite: MLA with a 512-wide latent and a 64-wide rope part, no q LoRA; the first layer
# dense, the others mixture-of-experts (64 routed, 6 per token, 2 shared). Plain rope (no YaRN).
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "hidden_act": "silu",
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "vocab_size": 102400,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# gpt-oss-20b: sliding-window (128) and full attention layers alternating, 64 query heads and 8 KV
# heads of 64, attention sinks, a mixture of experts; bf16 (no MXFP4 quantisation config).
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "experts_per_token": 4,
    "num_experts_per_tok": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "intermediate_size": 2880,
    "max_position_embeddings": 131072,
    "num_attention_heads": 64,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "rms_norm_eps": 1e-5,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "vocab_size": 201088,
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# An EAGLE draft head for LLAMA3_8B: one decoder layer over the target's hidden size.
LLAMA3_8B_EAGLE = {**LLAMA3_8B, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1}


# Multi-layer EAGLE (sglang's MultiLayerEagleWorker: one draft runner and KV pool per step, each captured on
# its own) is reached by a target whose draft class takes a per-step index: Step-3.5 (Step3p5ForCausalLM, its
# MTP head Step3p5MTP) is the one whose config class ships with sglang. Here with Llama-3-8B's attention and
# MLP shapes, every layer dense ("9999" names no MoE layer), sliding-window 128 and full layers 3:1. Per-layer
# lists run to 48 entries: the MTP block's layer id is fixed at 45 (step3p5_mtp.py), so the draft's folder
# keeps all 45 trunk layers in its config (only the MTP block is built) while the target is cut to 4.
STEP3P5_SLOTS = 48
STEP3P5_DENSE = {
    "architectures": ["Step3p5ForCausalLM"],
    "model_type": "step3p5",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 45,
    "num_attention_heads": 32,
    "num_attention_groups": 8,
    "head_dim": 128,
    "attention_other_setting": {"num_attention_heads": 32, "num_attention_groups": 8},
    "layer_types": ["full_attention" if i % 4 == 0 and i < 45 else "sliding_attention" for i in range(STEP3P5_SLOTS)],
    "sliding_window": 128,
    "yarn_only_types": [],
    "rope_theta": [500000.0] * STEP3P5_SLOTS,
    "partial_rotary_factors": [1.0] * STEP3P5_SLOTS,
    "use_head_wise_attn_gate": False,
    "swiglu_limits": None,
    "swiglu_limits_shared": None,
    "moe_layers_enum": "9999",
    "num_nextn_predict_layers": 3,
    "max_position_embeddings": 16384,
    "max_seq_len": 16384,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def with_layers(config: dict, layers: int) -> dict:
    """``config`` cut to ``layers`` decoder layers (gpt-oss keeps its sliding/full alternation)."""
    out = {**config, "num_hidden_layers": layers}
    if config["model_type"] == "gpt_oss":
        out["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    return out


MODELS = {
    # name -> (config, layers or None for all)
    "llama3-8b": (LLAMA3_8B, None),
    "llama3.2-1b": (LLAMA32_1B, None),
    "llama3-8b-4l": (LLAMA3_8B, 4),
    "llama3-8b-eagle": (LLAMA3_8B_EAGLE, None),
    "deepseek-v2-lite-4l": (DEEPSEEK_V2_LITE, 4),
    "gpt-oss-20b-4l": (GPT_OSS_20B, 4),
    "step3p5-dense-4l": (STEP3P5_DENSE, 4),
    "step3p5-dense-mtp3": (STEP3P5_DENSE, None),
}


def write_model(name: str, root: Path) -> Path:
    """A folder holding ``name``'s config.json (written once), for ``--model-path``."""
    config, layers = MODELS[name]
    if layers is not None:
        config = with_layers(config, layers)
    elif config["model_type"] == "gpt_oss":
        config = with_layers(config, config["num_hidden_layers"])
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return folder


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` in ``folder`` (written once): the word-level tokenizer
    described at ``TOKENIZER_CONFIG``. Built with the ``tokenizers`` package, which sglang needs anyway."""
    if (folder / "tokenizer.json").exists():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Engines started at once share the folder: each writes its own files and renames them into place.
    part = folder / f"tokenizer_config.json.{os.getpid()}"
    part.write_text(json.dumps(TOKENIZER_CONFIG, indent=1) + "\n")
    os.replace(part, folder / "tokenizer_config.json")
    part = folder / f"tokenizer.json.{os.getpid()}"
    tokenizer.save(str(part))
    os.replace(part, folder / "tokenizer.json")
