"""A tiny random-weight llama-style model in three attention layouts, plus its EAGLE draft head.

Weights are seeded, not trained. Each layer's residual update is damped so the next
token depends mostly on the current one (with attention perturbing it): generation is
deterministic and varied, and a one-layer draft sharing embedding and LM head agrees
with the target often enough that EAGLE accepts some drafts and rejects others.

Laid out to be cheap per decode step, as sglang's models are: projections of one input share a
matmul (`layers/linear.py`), each norm absorbs the residual add before it, and rotary embedding
reads a cos/sin table built once; on CUDA the norms and rotary run as Triton kernels
(`layers/elementwise.py`), so a layer issues about ten ops besides attention.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from refsgl.srt.configs.model_config import ModelConfig
from refsgl.srt.layers.layernorm import RMSNorm
from refsgl.srt.layers.linear import MergedLinear
from refsgl.srt.layers.logits_processor import LogitsProcessorOutput, select_logit_positions
from refsgl.srt.layers.rotary_embedding import RotaryEmbedding

RESIDUAL_SCALE = 0.35


class MHAAttention(nn.Module):
    """Grouped-query attention; on a sliding-window layer K/V live in the SWA pool."""

    def __init__(self, config: ModelConfig, layer_id: int, sliding_window: Optional[int] = None):
        super().__init__()
        self.layer_id = layer_id
        self.sliding_window = sliding_window
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        h = config.hidden_size
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(h, {"q_proj": q_size, "k_proj": kv_size, "v_proj": kv_size})
        self.o_proj = nn.Linear(q_size, h, bias=False)
        self.rotary_emb = RotaryEmbedding(self.head_dim, config.context_len)

    def forward(self, positions, hidden_states, forward_batch):
        n = hidden_states.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden_states))
        q, k = self.rotary_emb(
            positions, q.view(n, self.num_heads, self.head_dim), k.view(n, self.num_kv_heads, self.head_dim)
        )
        v = v.view(n, self.num_kv_heads, self.head_dim)
        forward_batch.token_to_kv_pool.set_kv_buffer(self.layer_id, forward_batch.out_cache_loc, k, v)
        out = forward_batch.attn_backend.forward(q, self, forward_batch)
        return self.o_proj(out.reshape(n, -1))

    def load_kv(self, pool, slots: torch.Tensor):
        if self.sliding_window is not None:
            slots = pool.translate_loc_from_full_to_swa(slots)
        k_buffer, v_buffer = pool.get_kv_buffer(self.layer_id)
        return k_buffer[slots], v_buffer[slots]


class MLAAttention(nn.Module):
    """Multi-head latent attention: the cache holds one latent + rope-key row per token."""

    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.sliding_window = None
        self.num_heads = config.num_attention_heads
        self.nope_dim = config.head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.v_dim = config.head_dim
        self.kv_lora_rank = config.kv_lora_rank
        h = config.hidden_size
        # The query and the latent + rope key both project the same input: one matmul.
        q_size = self.num_heads * (self.nope_dim + self.rope_dim)
        self.q_kv_a_proj = MergedLinear(h, {"q_proj": q_size, "kv_a_proj": self.kv_lora_rank + self.rope_dim})
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, self.num_heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, h, bias=False)
        self.rotary_emb = RotaryEmbedding(self.rope_dim, config.context_len)

    def forward(self, positions, hidden_states, forward_batch):
        n = hidden_states.shape[0]
        q, kv_a = self.q_kv_a_proj.split(self.q_kv_a_proj(hidden_states))
        q = q.view(n, self.num_heads, self.nope_dim + self.rope_dim)
        # kv_a is already the cache row (latent | rope key): rotating its key part in place leaves nothing to concat.
        cache_row = kv_a.unsqueeze(1)
        self.rotary_emb(positions, q[..., self.nope_dim :], cache_row[..., self.kv_lora_rank :])
        forward_batch.token_to_kv_pool.set_kv_buffer(self.layer_id, forward_batch.out_cache_loc, cache_row, None)
        out = forward_batch.attn_backend.forward(q, self, forward_batch)
        return self.o_proj(out.reshape(n, -1))

    def load_kv(self, pool, slots: torch.Tensor):
        rows = pool.get_key_buffer(self.layer_id)[slots][..., 0, :]
        latent, k_rope = rows[..., : self.kv_lora_rank], rows[..., self.kv_lora_rank :]
        kv = self.kv_b_proj(latent).view(*latent.shape[:-1], self.num_heads, self.nope_dim + self.v_dim)
        k_rope = k_rope.unsqueeze(-2).expand(*k_rope.shape[:-1], self.num_heads, self.rope_dim)
        k = torch.cat((kv[..., : self.nope_dim], k_rope), dim=-1)
        return k, kv[..., self.nope_dim :]


class DecoderLayer(nn.Module):
    """Pre-norm block. The residual stream is carried apart from the block's output (sglang's contract): each
    norm adds the previous block's damped output to it first, in the same kernel."""

    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__()
        if config.attention_layout == "mla":
            self.self_attn = MLAAttention(config, layer_id)
        else:
            window = config.sliding_window_size if layer_id in config.swa_layer_ids else None
            self.self_attn = MHAAttention(config, layer_id, sliding_window=window)
        h = config.hidden_size
        self.input_layernorm = RMSNorm(h)
        self.post_attention_layernorm = RMSNorm(h)
        self.mlp = nn.Sequential(nn.Linear(h, 2 * h, bias=False), nn.SiLU(), nn.Linear(2 * h, h, bias=False))

    def forward(self, positions, hidden_states, residual: Optional[torch.Tensor], forward_batch):
        """Returns (this block's MLP output, the residual stream before it is added)."""
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual, RESIDUAL_SCALE)
        attn = self.self_attn(positions, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(attn, residual, RESIDUAL_SCALE)
        return self.mlp(hidden_states), residual


class TinyLlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.is_draft:
            # EAGLE: fuse the token embedding with the hidden state the target (or previous step) produced.
            self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def get_embed_and_head(self):
        return self.embed_tokens.weight, self.lm_head.weight

    def set_embed_and_head(self, embed: nn.Parameter, head: nn.Parameter):
        self.embed_tokens.weight = embed
        self.lm_head.weight = head

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch) -> LogitsProcessorOutput:
        hidden_states = self.embed_tokens(input_ids)
        if self.config.is_draft:
            target_hidden = forward_batch.spec_info.hidden_states.to(hidden_states.dtype)
            hidden_states = self.fc(torch.cat((hidden_states, target_hidden), dim=-1))
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual, forward_batch)
        # Normalising every row and then picking is the same per row as picking first, and keeps the last
        # residual add fused into the norm.
        normed, hidden_states = self.norm(hidden_states, residual, RESIDUAL_SCALE)
        selected = select_logit_positions(forward_batch)
        logits = self.lm_head(normed if selected is None else normed[selected])
        return LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden_states)

    def checkpoint_shapes(self) -> list[tuple[str, torch.Size]]:
        """Names and shapes of the checkpoint this model loads, in parameter order: one tensor per projection
        (q_proj, k_proj, ...), as checkpoints store them, where the model merges some into one matmul."""
        modules = dict(self.named_modules())
        shapes = []
        for name, param in self.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if isinstance(modules[owner], MergedLinear):
                prefix = owner.rpartition(".")[0]
                prefix = prefix + "." if prefix else ""
                shapes.extend((f"{prefix}{shard}.{leaf}", shape) for shard, shape in modules[owner].shard_shapes())
            else:
                shapes.append((name, param.shape))
        return shapes

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors (named as `checkpoint_shapes` lists them) into the parameters."""
        params = dict(self.named_parameters())
        shards = {}
        for name, module in self.named_modules():
            if isinstance(module, MergedLinear):
                prefix = name.rpartition(".")[0]
                prefix = prefix + "." if prefix else ""
                shards.update({f"{prefix}{shard}.weight": (module, shard) for shard in module.shard_names})
        for name, tensor in weights:
            if name in shards:
                module, shard = shards[name]
                module.weight_loader(tensor, shard)
            elif name in params:
                if params[name].shape != tensor.shape:
                    raise ValueError(f"load_weights: {name} expects {tuple(params[name].shape)}, "
                                     f"got {tuple(tensor.shape)}")
                with torch.no_grad():
                    params[name].copy_(tensor)
            else:
                raise KeyError(f"load_weights: the model has no weight named {name!r}")


def build_model(config: ModelConfig, seed: int) -> TinyLlamaForCausalLM:
    """Construct with seeded weights (CPU generator, so every device gets the same model)."""
    generator = torch.Generator().manual_seed(seed)
    model = TinyLlamaForCausalLM(config)
    model.load_weights(
        (name, _seeded_weight(name, shape, config, generator))
        for name, shape in model.checkpoint_shapes()
        if not (name.endswith("layernorm.weight") or name == "norm.weight")  # norms start at ones
    )
    return model


def _seeded_weight(name: str, shape: torch.Size, config: ModelConfig, generator: torch.Generator) -> torch.Tensor:
    # Drawn per checkpoint tensor in checkpoint order, so merging projections changes no weight.
    if name == "embed_tokens.weight":
        return torch.randn(shape, generator=generator)
    if name == "fc.weight":
        # Start from "token embedding plus a little of the hidden state".
        h = config.hidden_size
        noise = torch.randn((h, h), generator=generator) / h**0.5
        return torch.cat((torch.eye(h), 0.2 * noise), dim=1)
    return torch.randn(shape, generator=generator) / shape[-1] ** 0.5
