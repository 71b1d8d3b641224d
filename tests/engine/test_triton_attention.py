"""The reference engine's Triton attention gives what its torch-native attention gives.

`TorchNativeAttnBackend` is the reference: every case builds a real KV pool, a scattered
`req_to_token` table, a real attention layer and a `ForwardBatch`, and runs both backends on the
same query. On CPU the kernels run through Triton's interpreter (slow, so the grid is curated to
cover each axis: batch, ragged lengths and length 1, GQA/MQA/MHA, tokens per request 1 and > 1,
row blocks, key-range splits, dtypes, SWA mapping and window, MLA); on a GPU the same and larger
shapes run compiled, and whole engines under CUDA graphs are compared.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(scope="module")
def m(refsgl):
    """The engine modules these tests build cases from (imported from the pristine engine copy)."""
    names = {
        "torch_backend": "refsgl.srt.layers.attention.torch_native_backend",
        "triton_backend": "refsgl.srt.layers.attention.triton_backend",
        "kernels": "refsgl.srt.layers.attention.triton_paged_attention",
        "pool": "refsgl.srt.mem_cache.memory_pool",
        "batch": "refsgl.srt.model_executor.forward_batch_info",
        "config": "refsgl.srt.configs.model_config",
        "model": "refsgl.srt.models.tiny_llama",
        "server_args": "refsgl.srt.server_args",
    }
    return SimpleNamespace(**{key: importlib.import_module(name) for key, name in names.items()})


@dataclasses.dataclass(frozen=True)
class Case:
    layout: str = "mha"
    dtype: torch.dtype = torch.float32
    prefix_lens: tuple = (5,)  # cached positions before this forward, per request
    tokens_per_req: int = 1
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    num_splits: int = 1
    window: int = 12  # swa only

    def __str__(self):
        return (f"{self.layout}-{str(self.dtype).split('.')[-1]}-lens{'_'.join(map(str, self.prefix_lens))}"
                f"-T{self.tokens_per_req}-h{self.heads}kv{self.kv_heads}d{self.head_dim}-s{self.num_splits}")


def build(m, case: Case, device: str, seed: int = 0):
    """Both backends, a layer, a forward batch and a query for `case`, over one shared KV pool."""
    gen = torch.Generator().manual_seed(seed)
    bs, T = len(case.prefix_lens), case.tokens_per_req
    total = [p + T for p in case.prefix_lens]
    size = sum(total) + 8
    rows = torch.randperm(bs + 3, generator=gen)[:bs]
    req_to_token_pool = m.pool.ReqToTokenPool(size=bs + 3, max_context_len=max(total) + 5, device=device)
    slots = (torch.randperm(size, generator=gen) + 1)[: sum(total)]  # scattered, never slot 0
    start = 0
    for row, n in zip(rows.tolist(), total):
        req_to_token_pool.req_to_token[row, :n] = slots[start : start + n].to(torch.int32)
        start += n

    config = m.config.ModelConfig(
        attention_layout=case.layout, vocab_size=32, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=case.heads, num_key_value_heads=case.kv_heads, head_dim=case.head_dim,
        kv_lora_rank=32, qk_rope_head_dim=8, sliding_window_size=case.window if case.layout == "swa" else None,
    )
    if case.layout == "mla":
        pool = m.pool.MLATokenToKVPool(size, config.kv_lora_rank, config.qk_rope_head_dim, 1, case.dtype, device)
        layer = m.model.MLAAttention(config, layer_id=0).to(device=device, dtype=case.dtype)
        qk_dim = case.head_dim + config.qk_rope_head_dim
    elif case.layout == "swa":
        # Layer 1 is the sliding-window layer; its KV lives in the SWA pool under mapped slots.
        pool = m.pool.SWAKVPool(size, size, swa_attention_layer_ids=[1], full_attention_layer_ids=[0],
                                head_num=case.kv_heads, head_dim=case.head_dim, dtype=case.dtype, device=device)
        layer = m.model.MHAAttention(config, layer_id=1, sliding_window=case.window)
        mapping = torch.zeros(size + 1, dtype=torch.int64)
        swa_slots = iter((torch.randperm(size, generator=gen) + 1).tolist())
        for row, prefix_len, n in zip(rows.tolist(), case.prefix_lens, total):
            # Positions before the first query's window are unmapped (0), as the engine evicts them.
            for slot in req_to_token_pool.req_to_token[row, max(0, prefix_len - case.window + 1) : n].tolist():
                mapping[slot] = next(swa_slots)
        pool.full_to_swa_index_mapping.copy_(mapping)
        qk_dim = case.head_dim
    else:
        pool = m.pool.MHATokenToKVPool(size, case.kv_heads, case.head_dim, 1, case.dtype, device)
        layer = m.model.MHAAttention(config, layer_id=0)
        qk_dim = case.head_dim
    for buffers in _buffers(pool):
        for buffer in buffers:
            buffer.copy_(torch.randn(buffer.shape, generator=gen).to(case.dtype))  # padding slot 0 too

    prefix = torch.tensor(case.prefix_lens, dtype=torch.int64)
    positions = (prefix[:, None] + torch.arange(T)[None, :]).reshape(-1)
    mode = m.batch.ForwardMode.DECODE if T == 1 else m.batch.ForwardMode.TARGET_VERIFY
    forward_batch = m.batch.ForwardBatch(
        forward_mode=mode,
        batch_size=bs,
        input_ids=torch.zeros(bs * T, dtype=torch.int64, device=device),
        req_pool_indices=rows.to(device),
        seq_lens=(prefix + (T if T == 1 else 0)).to(device),
        positions=positions.to(device),
        out_cache_loc=req_to_token_pool.req_to_token[rows.repeat_interleave(T).to(device), positions.to(device)].long(),
        num_tokens_per_req=T if T > 1 else None,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool=pool,
    )
    runner = SimpleNamespace(req_to_token_pool=req_to_token_pool, model_config=config, device=device)
    q = torch.randn((bs * T, case.heads, qk_dim), generator=gen).to(device=device, dtype=case.dtype)
    return runner, layer, forward_batch, q


def _buffers(pool):
    if hasattr(pool, "full_kv_pool"):
        return [*_buffers(pool.full_kv_pool), *_buffers(pool.swa_kv_pool)]
    if hasattr(pool, "kv_buffer"):
        return [pool.kv_buffer]
    return [pool.k_buffer, pool.v_buffer]


def run_both(m, case: Case, device: str):
    runner, layer, forward_batch, q = build(m, case, device)
    reference = m.torch_backend.TorchNativeAttnBackend(runner)
    reference.init_forward_metadata(forward_batch)
    expected = reference.forward(q, layer, forward_batch)
    backend = m.triton_backend.TritonAttnBackend(runner)
    backend.init_forward_metadata(forward_batch)
    backend.forward_metadata = dataclasses.replace(backend.forward_metadata, num_splits=case.num_splits)
    with torch.no_grad():
        got = backend.forward(q, layer, forward_batch)
    return got, expected


TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 4e-2}

CASES = [
    Case(prefix_lens=(0,)),  # a one-token context: the query sees only itself
    Case(prefix_lens=(5, 0, 37, 130), num_splits=3),  # ragged, several key blocks, splits
    Case(prefix_lens=(70, 3), tokens_per_req=4, num_splits=2),  # target-verify shape, causal inside the chain
    Case(prefix_lens=(9, 64, 1), tokens_per_req=3, heads=8, kv_heads=1),  # MQA, 24 query rows per KV head
    Case(prefix_lens=(10, 40), tokens_per_req=5, heads=16, kv_heads=1),  # 80 rows: two row blocks
    Case(prefix_lens=(20, 50), heads=4, kv_heads=4, head_dim=24, num_splits=4),  # MHA, head dim not a power of 2
    Case(prefix_lens=(33, 100), dtype=torch.bfloat16, num_splits=2),
    Case(prefix_lens=(33, 2), dtype=torch.float16, tokens_per_req=2),
    Case(layout="swa", prefix_lens=(5, 40, 90), num_splits=2),
    Case(layout="swa", prefix_lens=(30, 3), tokens_per_req=3, window=7, dtype=torch.bfloat16),
    Case(layout="mla", prefix_lens=(4, 70), num_splits=2),
    Case(layout="mla", prefix_lens=(25,), tokens_per_req=4, dtype=torch.bfloat16),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_triton_backend_matches_torch_native(m, case, device):
    got, expected = run_both(m, case, device)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCE[case.dtype], rtol=TOLERANCE[case.dtype])


def test_keys_are_read_through_req_to_token(m, device):
    """Repointing a request's positions at other slots changes the output (nothing reads slots by position)."""
    case = Case(prefix_lens=(20,))
    runner, layer, forward_batch, q = build(m, case, device)
    backend = m.triton_backend.TritonAttnBackend(runner)
    backend.init_forward_metadata(forward_batch)
    with torch.no_grad():
        before = backend.forward(q, layer, forward_batch)
        row = runner.req_to_token_pool.req_to_token[forward_batch.req_pool_indices[0]]
        row[:10] = row[:10].flip(0)  # same slots, other positions: softmax is order-free, so still equal
        same = backend.forward(q, layer, forward_batch)
        row[3] = row[15]  # position 3 now reads position 15's KV
        changed = backend.forward(q, layer, forward_batch)
    torch.testing.assert_close(same, before, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(changed, before, atol=1e-4)


def test_ragged_prefill_stays_on_torch(m, device):
    case = Case(prefix_lens=(3, 8))
    runner, layer, forward_batch, q = build(m, case, device)
    forward_batch.forward_mode = m.batch.ForwardMode.EXTEND
    forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu = [3, 8], [1, 1]
    backend = m.triton_backend.TritonAttnBackend(runner)
    backend.init_forward_metadata(forward_batch)
    assert backend.forward_metadata.tokens_per_req is None
    reference = m.torch_backend.TorchNativeAttnBackend(runner)
    reference.init_forward_metadata(forward_batch)
    torch.testing.assert_close(backend.forward(q, layer, forward_batch), reference.forward(q, layer, forward_batch))


def test_missing_metadata_is_an_error(m, device):
    runner, layer, forward_batch, q = build(m, Case(), device)
    with pytest.raises(RuntimeError, match="init_forward_metadata"):
        m.triton_backend.TritonAttnBackend(runner).forward(q, layer, forward_batch)


def test_bad_shapes_name_the_problem(m, device):
    runner, layer, forward_batch, q = build(m, Case(prefix_lens=(4, 6)), device)
    pool = forward_batch.token_to_kv_pool
    r2t = runner.req_to_token_pool.req_to_token
    k, v = pool.k_buffer[0], pool.v_buffer[0]
    attend = m.kernels.paged_attention
    kwargs = dict(sm_scale=0.25, num_splits=1)
    with pytest.raises(ValueError, match="do not split into 3 per request"):
        attend(q, k, v, r2t, forward_batch.req_pool_indices, forward_batch.positions, tokens_per_req=3, **kwargs)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        attend(q[:, :3], k, v, r2t, forward_batch.req_pool_indices, forward_batch.positions, tokens_per_req=1,
               **kwargs)
    with pytest.raises(ValueError, match="dtypes differ"):
        attend(q.half(), k, v, r2t, forward_batch.req_pool_indices, forward_batch.positions, tokens_per_req=1,
               **kwargs)
    with pytest.raises(ValueError, match="sliding window"):
        attend(q, k, v, r2t, forward_batch.req_pool_indices, forward_batch.positions, tokens_per_req=1,
               window=0, **kwargs)
    with pytest.raises(ValueError, match="num_splits"):
        attend(q, k, v, r2t, forward_batch.req_pool_indices, forward_batch.positions, tokens_per_req=1,
               sm_scale=0.25, num_splits=0)


def test_backend_switch(m):
    args = m.server_args.ServerArgs(device="cpu")
    assert args.attention_backend == "torch_native"  # auto: the reference off CUDA
    assert m.server_args.ServerArgs(device="cpu", attention_backend="triton").attention_backend == "triton"
    if torch.cuda.is_available():
        assert m.server_args.ServerArgs(device="cuda").attention_backend == "triton"
    with pytest.raises(ValueError, match="ServerArgs.attention_backend"):
        m.server_args.ServerArgs(device="cpu", attention_backend="flashinfer")


# ---------------------------------------------------------------- whole engine

TINY = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_running_requests=4, max_context_len=128, max_total_tokens=1024,
            chunked_prefill_size=512, sliding_window_size=12)


def prompts(n=3, seed=1):
    rng = random.Random(seed)
    return [[rng.randrange(128) for _ in range(rng.randint(14, 30))] for _ in range(n)]


@pytest.mark.parametrize(
    "layout, eagle", [("mha", True), ("mla", False), ("swa", False)], ids=["mha-eagle", "mla", "swa"]
)
def test_engine_generates_the_same_tokens(refsgl, layout, eagle, device):
    """Decode, EAGLE draft steps, target verify and draft-extend all run the Triton kernels."""
    outputs = {}
    for backend in ("torch_native", "triton"):
        engine = refsgl.Engine(**TINY, attention_layout=layout, attention_backend=backend, device=device,
                               speculative_algorithm="EAGLE" if eagle else None)
        outputs[backend] = engine.generate(prompts(), 6)
        if eagle:
            assert engine.scheduler.stats.proposed_drafts > 0
    assert outputs["triton"] == outputs["torch_native"]


# ---------------------------------------------------------------- GPU only

GPU_CASES = [
    Case(dtype=torch.bfloat16, prefix_lens=(0, 100, 4097, 2048, 777), heads=32, kv_heads=8, head_dim=128,
         num_splits=16),
    Case(dtype=torch.bfloat16, prefix_lens=(0, 100, 4097, 2048, 777), heads=32, kv_heads=8, head_dim=128),
    Case(dtype=torch.float16, prefix_lens=(3000, 17), tokens_per_req=4, heads=32, kv_heads=8, head_dim=128,
         num_splits=7),
    Case(dtype=torch.bfloat16, layout="swa", prefix_lens=(5000, 60), heads=16, kv_heads=8, head_dim=128,
         window=1024, num_splits=4),
    Case(dtype=torch.float32, layout="mla", prefix_lens=(1500, 2), tokens_per_req=2, heads=16, num_splits=5),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_compiled_kernels_match_torch_native_at_model_shapes(m, case):
    got, expected = run_both(m, case, "cuda")
    torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCE[case.dtype], rtol=TOLERANCE[case.dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_engine_under_cuda_graphs_matches_torch_native(refsgl, layout):
    """Captured graphs replay the Triton kernels with each step's own lengths (read from device memory)."""
    outputs, graph_steps = {}, {}
    for backend in ("torch_native", "triton"):
        engine = refsgl.Engine(**dict(TINY, max_running_requests=8, cuda_graph_max_bs=8), attention_layout=layout,
                               attention_backend=backend, speculative_algorithm="EAGLE")
        assert engine.model_runner.graph_runner is not None
        outputs[backend] = engine.generate(prompts(n=8, seed=2), 24)
        graph_steps[backend] = engine.scheduler.stats.decode_batches
    assert outputs["triton"] == outputs["torch_native"]
    assert graph_steps["triton"] > 0


@pytest.mark.gpu
def test_bf16_engine_logits_stay_close(refsgl):
    """bf16 engines: the first decode step's logits agree to bf16 rounding (greedy text may differ later)."""
    logits = {}
    for backend in ("torch_native", "triton"):
        engine = refsgl.Engine(**TINY, dtype="bfloat16", attention_backend=backend)
        for prompt in prompts(n=4, seed=3):
            engine.add_request(prompt, 4)
        engine.step()  # prefill (torch in both)
        runner = engine.model_runner
        captured = {}
        original = runner.forward

        def spy(forward_batch, *args, **kwargs):
            out = original(forward_batch, *args, **kwargs)
            if forward_batch.forward_mode.is_decode():
                captured.setdefault("logits", out.logits_output.next_token_logits.float().clone())
            return out

        runner.forward = spy
        engine.step()  # first decode step, through the CUDA graph
        logits[backend] = captured["logits"]
    torch.testing.assert_close(logits["triton"], logits["torch_native"], atol=5e-2, rtol=5e-2)
