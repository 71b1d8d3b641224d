"""A tiny random-weight llama-style model in three attention layouts, plus its EAGLE draft head.

Weights are seeded, not trained. Each layer's residual update is damped so the next
token depends mostly on the current one (with attention perturbing it): generation is
deterministic and varied, and a one-layer draft sharing embedding and LM head agrees
with the target often enough that EAGLE accepts some drafts and rejects others.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from refsgl.srt.configs.model_config import ModelConfig
from refsgl.srt.layers.logits_processor import LogitsProcessorOutput, select_logit_positions

RESIDUAL_SCALE = 0.35


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of the last dim by position-dependent angles (NeoX style)."""
    half = x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos = angles.cos()[:, None, :].to(x.dtype)
    sin = angles.sin()[:, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


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
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def forward(self, positions, hidden_states, forward_batch):
        n = hidden_states.shape[0]
        q = apply_rotary(self.q_proj(hidden_states).view(n, self.num_heads, self.head_dim), positions)
        k = apply_rotary(self.k_proj(hidden_states).view(n, self.num_kv_heads, self.head_dim), positions)
        v = self.v_proj(hidden_states).view(n, self.num_kv_heads, self.head_dim)
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
        self.q_proj = nn.Linear(h, self.num_heads * (self.nope_dim + self.rope_dim), bias=False)
        self.kv_a_proj = nn.Linear(h, self.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, self.num_heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, h, bias=False)

    def forward(self, positions, hidden_states, forward_batch):
        n = hidden_states.shape[0]
        q = self.q_proj(hidden_states).view(n, self.num_heads, self.nope_dim + self.rope_dim)
        q = torch.cat((q[..., : self.nope_dim], apply_rotary(q[..., self.nope_dim :], positions)), dim=-1)
        latent, k_rope = self.kv_a_proj(hidden_states).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        k_rope = apply_rotary(k_rope.unsqueeze(1), positions)
        cache_row = torch.cat((latent.unsqueeze(1), k_rope), dim=-1)
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

    def forward(self, positions, hidden_states, forward_batch):
        attn = self.self_attn(positions, self.input_layernorm(hidden_states), forward_batch)
        hidden_states = hidden_states + RESIDUAL_SCALE * attn
        return hidden_states + RESIDUAL_SCALE * self.mlp(self.post_attention_layernorm(hidden_states))


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
        for layer in self.layers:
            hidden_states = layer(positions, hidden_states, forward_batch)
        selected = select_logit_positions(forward_batch)
        last_hidden = hidden_states if selected is None else hidden_states[selected]
        logits = self.lm_head(self.norm(last_hidden))
        return LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden_states)


def build_model(config: ModelConfig, seed: int) -> TinyLlamaForCausalLM:
    """Construct with seeded weights (CPU generator, so every device gets the same model)."""
    generator = torch.Generator().manual_seed(seed)
    model = TinyLlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                continue
            if name == "embed_tokens.weight":
                param.copy_(torch.randn(param.shape, generator=generator))
            elif name == "fc.weight":
                # Start from "token embedding plus a little of the hidden state".
                h = config.hidden_size
                noise = torch.randn((h, h), generator=generator) / h**0.5
                param.copy_(torch.cat((torch.eye(h), 0.2 * noise), dim=1))
            else:
                fan_in = param.shape[-1]
                param.copy_(torch.randn(param.shape, generator=generator) / fan_in**0.5)
    return model
