"""The model's fused layers: Triton RMSNorm / rotary kernels against their torch paths, merged projections
loading an unfused checkpoint, and whole engines on the Triton layers generating what the torch layers generate.

On CPU the kernels run through Triton's interpreter (`TRITON_INTERPRET=1`, set by tests/conftest.py); on a
GPU the same cases and model-sized ones run compiled.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(scope="module")
def m(refsgl):
    names = {
        "custom_op": "refsgl.srt.layers.custom_op",
        "layernorm": "refsgl.srt.layers.layernorm",
        "rotary": "refsgl.srt.layers.rotary_embedding",
        "linear": "refsgl.srt.layers.linear",
        "model": "refsgl.srt.models.tiny_llama",
        "config": "refsgl.srt.configs.model_config",
    }
    return SimpleNamespace(**{key: importlib.import_module(name) for key, name in names.items()})


@pytest.fixture(scope="module")
def kernels(refsgl):
    return importlib.import_module("refsgl.srt.layers.elementwise")


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _randn(shape, dtype, device, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


# ---------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [64, 100])  # 100: the block is masked past the row
@pytest.mark.parametrize("fused_residual", [False, True], ids=["plain", "residual"])
def test_rmsnorm_kernel_matches_torch_path(m, kernels, device, dtype, hidden, fused_residual):
    norm = m.layernorm.RMSNorm(hidden).to(device)
    norm.weight.data = _randn((hidden,), torch.float32, device, 1).to(dtype)
    # Rows of a wider buffer: the kernel takes strided rows, as the model's views are.
    x = _randn((7, hidden + 9), dtype, device, 2)[:, 3 : 3 + hidden]
    residual = _randn((7, hidden), dtype, device, 3) if fused_residual else None
    args = (x,) if residual is None else (x, residual, 0.35)
    expected = norm.forward_native(*args)
    got = kernels.rmsnorm(x, norm.weight, norm.eps, residual, 0.35)
    tol = TOLERANCE[dtype]
    if fused_residual:
        torch.testing.assert_close(got[1], expected[1], atol=tol, rtol=tol)  # the residual stream itself
        got, expected = got[0], expected[0]
    assert got.dtype == dtype and got.shape == (7, hidden)
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def test_rmsnorm_kernel_takes_no_rows(kernels, device):
    x = torch.empty((0, 32), device=device)
    assert kernels.rmsnorm(x, torch.ones(32, device=device), 1e-6).shape == (0, 32)


def test_rmsnorm_kernel_refuses_bad_shapes(kernels, device):
    x = torch.ones((4, 32), device=device)
    with pytest.raises(ValueError, match="weight"):
        kernels.rmsnorm(x, torch.ones(16, device=device), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        kernels.rmsnorm(x, torch.ones(32, device=device), 1e-6, residual=torch.ones((4, 32), device=device,
                                                                                   dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        kernels.rmsnorm(x.t(), torch.ones(4, device=device), 1e-6)


# ---------------------------------------------------------------- rotary embedding


def _mha_views(buffer, n, q_heads, k_heads, dim):
    """q and k as the MHA layer gets them: head views into one merged qkv output."""
    q, k, _ = buffer.split([q_heads * dim, k_heads * dim, k_heads * dim], dim=-1)
    return q.view(n, q_heads, dim), k.view(n, k_heads, dim)


def _mla_views(buffer, n, heads, nope, rope, rank):
    """The MLA layer's rope parts: per-head tails of the query and the tail of the latent cache row."""
    q, kv_a = buffer.split([heads * (nope + rope), rank + rope], dim=-1)
    return q.view(n, heads, nope + rope)[..., nope:], kv_a.unsqueeze(1)[..., rank:]


ROTARY_CASES = {
    "mha-gqa": (lambda b, n: _mha_views(b, n, 4, 2, 16), 4 * 16 + 2 * 2 * 16, 16),
    "mha-mqa-dim24": (lambda b, n: _mha_views(b, n, 6, 1, 24), 6 * 24 + 2 * 24, 24),
    "mla": (lambda b, n: _mla_views(b, n, 4, 16, 8, 32), 4 * 24 + 32 + 8, 8),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(ROTARY_CASES))
def test_rotary_kernel_matches_torch_path_and_touches_nothing_else(m, kernels, device, dtype, case):
    views, width, rot = ROTARY_CASES[case]
    rotary = m.rotary.RotaryEmbedding(rot, max_position=300).to(device=device, dtype=dtype)
    n = 9
    positions = torch.tensor([0, 1, 2, 17, 17, 100, 255, 298, 299], device=device)
    original = _randn((n, width), dtype, device, 4)
    native, triton_out = original.clone(), original.clone()
    rotary.forward_native(positions, *views(native, n))
    kernels.rotary_embedding_neox_(positions, *views(triton_out, n), rotary.cos_sin_cache)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(triton_out.float(), native.float(), atol=tol, rtol=tol)
    # Only the rope parts of q and k move (v, the MLA nope dims and latent stay put), and position 0 is identity.
    rotated = torch.zeros_like(original, dtype=torch.bool)
    for view in views(rotated, n):
        view.fill_(True)
    assert torch.equal(triton_out[~rotated], original[~rotated])
    assert torch.equal(triton_out[0], original[0])


def test_rotary_table_holds_the_angles(m):
    """cos | sin of p * base^(-i / half), and a rotation keeps every pair's length."""
    rotary = m.rotary.RotaryEmbedding(8, max_position=64, base=100.0)
    p, i = 37, 3
    angle = p * 100.0 ** (-i / 4)
    assert rotary.cos_sin_cache[p, i].item() == pytest.approx(torch.tensor(angle).cos().item(), abs=1e-5)
    assert rotary.cos_sin_cache[p, 4 + i].item() == pytest.approx(torch.tensor(angle).sin().item(), abs=1e-5)
    q, k = torch.randn(5, 2, 8), torch.randn(5, 1, 8)
    before = torch.cat((q, k), dim=1)
    rotary.forward_native(torch.tensor([0, 3, 9, 37, 63]), q, k)
    after = torch.cat((q, k), dim=1)
    pair_len = lambda x: x[..., :4] ** 2 + x[..., 4:] ** 2  # noqa: E731
    torch.testing.assert_close(pair_len(after), pair_len(before), atol=1e-5, rtol=1e-5)


def test_rotary_kernel_refuses_mismatched_shapes(m, kernels, device):
    table = m.rotary.RotaryEmbedding(8, max_position=16).cos_sin_cache.to(device)
    q, k = torch.zeros((3, 2, 8), device=device), torch.zeros((3, 1, 8), device=device)
    with pytest.raises(ValueError, match="disagree"):
        kernels.rotary_embedding_neox_(torch.zeros(2, dtype=torch.int64, device=device), q, k, table)
    with pytest.raises(ValueError, match="rotary dim"):
        kernels.rotary_embedding_neox_(torch.zeros(3, dtype=torch.int64, device=device), q, k, table[:, :6])


def test_odd_rotary_dim_is_refused(m):
    with pytest.raises(ValueError, match="even"):
        m.rotary.RotaryEmbedding(7, max_position=16)


# ---------------------------------------------------------------- merged projections and loading


def _config(m, layout):
    return m.config.ModelConfig(
        attention_layout=layout, vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=4, kv_lora_rank=8, qk_rope_head_dim=4,
        sliding_window_size=4 if layout == "swa" else None,
    )


def test_checkpoint_lists_each_projection_apart_in_parameter_order(m):
    model = m.model.TinyLlamaForCausalLM(_config(m, "mha"))
    names = [name for name, _ in model.checkpoint_shapes()]
    layer0 = [n.removeprefix("layers.0.") for n in names if n.startswith("layers.0.")]
    assert layer0 == ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                      "self_attn.o_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
                      "mlp.0.weight", "mlp.2.weight"]
    assert dict(model.checkpoint_shapes())["layers.1.self_attn.k_proj.weight"] == (2 * 4, 16)
    mla = m.model.TinyLlamaForCausalLM(_config(m, "mla"))
    shapes = dict(mla.checkpoint_shapes())
    assert shapes["layers.0.self_attn.q_proj.weight"] == (4 * (4 + 4), 16)
    assert shapes["layers.0.self_attn.kv_a_proj.weight"] == (8 + 4, 16)


@pytest.mark.parametrize("layout", ["mha", "mla"])
def test_merged_projection_is_its_shards_side_by_side(m, layout):
    """Loading shard by shard puts each checkpoint tensor where its own projection would have computed it."""
    model = m.model.build_model(_config(m, layout), seed=3)
    checkpoint = {}
    gen = torch.Generator().manual_seed(5)
    for name, shape in model.checkpoint_shapes():
        checkpoint[name] = torch.randn(shape, generator=gen)
    model.load_weights(checkpoint.items())
    attn = model.layers[1].self_attn
    merged = attn.qkv_proj if layout == "mha" else attn.q_kv_a_proj
    x = torch.randn(3, 16, generator=gen)
    for shard, out in zip(merged.shard_names, merged.split(merged(x))):
        torch.testing.assert_close(out, x @ checkpoint[f"layers.1.self_attn.{shard}.weight"].t())


def test_bad_checkpoint_names_the_weight(m):
    model = m.model.TinyLlamaForCausalLM(_config(m, "mha"))
    with pytest.raises(KeyError, match="layers.0.self_attn.qkv_weight"):
        model.load_weights([("layers.0.self_attn.qkv_weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shard 'k_proj'"):
        model.load_weights([("layers.0.self_attn.k_proj.weight", torch.zeros(5, 16))])
    with pytest.raises(ValueError, match="lm_head.weight"):
        model.load_weights([("lm_head.weight", torch.zeros(5, 16))])


# ---------------------------------------------------------------- whole engine

TINY = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_running_requests=4, max_context_len=128, max_total_tokens=1024,
            chunked_prefill_size=512, sliding_window_size=12)


def prompts(n=2, seed=1):
    rng = random.Random(seed)
    return [[rng.randrange(128) for _ in range(rng.randint(14, 30))] for _ in range(n)]


@pytest.mark.parametrize(
    "layout, eagle", [("mha", True), ("mla", False), ("swa", False)], ids=["mha-eagle", "mla", "swa"]
)
def test_triton_layers_generate_what_the_torch_layers_generate(refsgl, m, layout, eagle):
    """Prefill, decode and (EAGLE) draft / verify / draft-extend forwards through the Triton layers (on CPU via
    the interpreter) give the torch layers' greedy tokens."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        # Where CUDA is visible the interpreter is off and Triton cannot run a CPU engine's tensors; there the
        # layer kernels are compared with their torch paths one by one on CUDA (tests above).
        pytest.skip("a CPU engine's Triton layers need Triton's interpreter, which is off where CUDA is visible")
    outputs = {}
    for path in ("torch", "triton"):
        engine = refsgl.Engine(**TINY, attention_layout=layout, device="cpu",
                               speculative_algorithm="EAGLE" if eagle else None)
        with m.custom_op.triton_everywhere() if path == "triton" else contextlib.nullcontext():
            outputs[path] = engine.generate(prompts(), 6)
        if eagle:
            assert engine.scheduler.stats.proposed_drafts > 0
    assert outputs["triton"] == outputs["torch"]


# ---------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_compiled_kernels_match_torch_path_at_model_shapes(m, kernels, dtype):
    """bench/engine/step_floor.py's engine shape: hidden 2048, 16 query / 8 KV heads x 128; an MLA rope of 64 over 512 latents."""
    device, n = "cuda", 37
    norm = m.layernorm.RMSNorm(2048).to(device)
    norm.weight.data = _randn((2048,), torch.float32, device, 1).to(dtype)
    x, residual = _randn((n, 2048), dtype, device, 2), _randn((n, 2048), dtype, device, 3)
    for got, expected in zip(kernels.rmsnorm(x, norm.weight, norm.eps, residual, 0.35),
                             norm.forward_native(x, residual, 0.35)):
        torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    positions = torch.randint(0, 8192, (n,), device=device)
    for views, width, rot in [(lambda b: _mha_views(b, n, 16, 8, 128), 32 * 128, 128),
                              (lambda b: _mla_views(b, n, 16, 128, 64, 512), 16 * 192 + 576, 64)]:
        rotary = m.rotary.RotaryEmbedding(rot, max_position=8192).to(device=device, dtype=dtype)
        native = _randn((n, width), dtype, device, 4)
        compiled = native.clone()
        rotary.forward_native(positions, *views(native))
        kernels.rotary_embedding_neox_(positions, *views(compiled), rotary.cos_sin_cache)
        torch.testing.assert_close(compiled.float(), native.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_cuda_engine_generates_what_the_cpu_engine_generates(refsgl, layout):
    """fp32: the CUDA engine (Triton layers and attention, decode and draft-extend in CUDA graphs) against the
    CPU engine (torch layers, torch-native attention), EAGLE on."""
    outputs = {}
    for device in ("cpu", "cuda"):
        engine = refsgl.Engine(**dict(TINY, max_running_requests=8, cuda_graph_max_bs=8), attention_layout=layout,
                               device=device, speculative_algorithm="EAGLE")
        outputs[device] = engine.generate(prompts(n=8, seed=2), 24)
    assert outputs["cuda"] == outputs["cpu"]
