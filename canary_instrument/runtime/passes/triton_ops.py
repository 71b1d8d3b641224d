"""Load the rendered Triton canary kernels and launch them: one launch per pass, fixed grid.

Kernels come from the installed ``canary_instrument.kernels`` package, or from the checkout's
``kernels/`` when running from source. Launch arguments are device tensors only (sizes are read
on the device), so a launch can be captured in a CUDA graph and replayed with new plan values.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import triton

from ...codegen.linemap import annotate
from ...codegen.specs import PARTIAL_WORDS, Spec, spec_for
from . import layers
from .state import GROUP_FULL, CanaryGroup, CanaryState, PlanInputs


@dataclass(frozen=True)
class Launch:
    block: int  # positions per tile
    num_warps: int
    programs_per_sm: int


# Per real-KV mode, the launch measured best in bench/kernels/RESULTS.md (realkv=all fingerprints
# whole rows, where small tiles keep registers in check).
DEFAULT_LAUNCH = {
    "none": Launch(128, 4, 16),
    "partial": Launch(128, 4, 16),
    "all": Launch(128, 4, 16),
}
MAX_FP_CHUNK = 32
MARK_BLOCK = 1024  # freed-slot entries per program of the mark kernel
# Layers the post pass fingerprints at once (realkv=partial, two words a row), so their loads wait for the
# device together: LAYER_CHUNK for every lane of a wide block (a prefill chunk; a wider tile costs registers
# the verify sharing the kernel needs), FEW_LAYERS for a block whose live lanes are among its first FEW.
MAX_LAYER_CHUNK = 8
FEW = 8
MAX_FEW_LAYERS = 64


def kernels_dir() -> Path:
    """Where the rendered kernels live: inside the installed package, else the source checkout."""
    package = Path(__file__).resolve().parents[2]  # .../canary_instrument
    shipped = package / "kernels"
    if (shipped / "manifest.json").is_file():
        return shipped
    checkout = package.parent / "kernels"
    if (checkout / "manifest.json").is_file():
        return checkout
    raise FileNotFoundError(
        f"no rendered canary kernels in {shipped} or {checkout}; run `canary-instrument build-kernels`"
    )


@lru_cache(maxsize=None)
def load_kernel_module(spec: Spec, directory: Path | None = None):
    path = (directory or kernels_dir()) / spec.filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `canary-instrument build-kernels`")
    name = f"canary_instrument.kernels.{spec.stem}"
    if directory is not None:
        name += f"_{abs(hash(str(directory)))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _power_of_two(name: str, value: int | None, minimum: int) -> None:
    if value is not None and (value < minimum or value & (value - 1)):
        raise ValueError(f"TritonCanaryOps({name}={value}): must be a power of two >= {minimum}")


MIN_MAX_BS = 16
COMPILE_THREADS = 8


def compile_plan_widths(kernel, args: list, grid: tuple, options: dict, max_reqs: int) -> None:
    """Compile ``kernel`` for every plan width a batch of up to ``max_reqs`` requests can need, in parallel
    threads, without launching it. Called at the first launch of each signature (in sglang, during start-up:
    CUDA graph capture meets each forward kind), so no later forward, eager or captured, stops to compile a
    new batch-size bucket."""
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    widths = [MIN_MAX_BS << i for i in range(plan_width(max_reqs).bit_length() - MIN_MAX_BS.bit_length() + 1)]
    try:  # Triton's own parallel compile: warmup() submits each compile to the pool, the block's end waits
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # an older Triton: one compile after another
        AsyncCompileMode = None
    with ThreadPoolExecutor(max_workers=min(COMPILE_THREADS, len(widths))) as pool, (
            AsyncCompileMode(pool) if AsyncCompileMode is not None else contextlib.nullcontext()):
        for width in widths:
            kernel.warmup(*args, grid=grid, MAX_BS=width, **options)


def plan_width(num_reqs: int) -> int:
    """The kernels' MAX_BS: lanes of the per-request plan every program rebuilds in registers, the
    batch size rounded up to a power of two (at least 16). Sized by the batch, not the req-pool
    capacity: sglang's pool has 2049-4097 rows by default, and plan vectors that wide spill and cost
    every program a scan of thousands of lanes (bench/kernels/RESULTS.md). A captured graph has one
    batch size, so it compiles one variant; eager batches add at most one per power of two."""
    return max(MIN_MAX_BS, _next_pow2(max(1, int(num_reqs))))


def layer_args(group: CanaryGroup) -> list:
    """A fingerprinted group's kernel arguments: the per-layer pointer table, the row stride, the layer count and
    the table of layers 1..'s fingerprints with its layer stride."""
    table = layers.fingerprint_table(group)
    if table.stride(0) != 1:
        raise ValueError("kv canary: the layer fingerprint table must be layer-major (slot stride 1)")
    return [layers.pointer_table(group), group.kv_words.stride(0), layers.layer_count(group), table, table.stride(1)]


def state_spec(state: CanaryState) -> Spec:
    v_half = any(g.half == 1 for g in state.groups)
    spec = spec_for(state.layout, v_half, state.realkv)
    want = [(g.group, g.half) for g in spec.groups]
    have = [(g.group, g.half) for g in state.groups]
    if have != want:
        raise ValueError(f"CanaryState.groups for layout {state.layout!r} must be (group, half) {want}, got {have}")
    for g in state.groups:
        if g.rows.dtype != torch.int64 or g.rows.dim() != 2 or g.rows.shape[1] != 4 or not g.rows.is_contiguous():
            raise ValueError(f"CanaryGroup(group={g.group}, half={g.half}).rows must be contiguous int64 [slots, 4]")
        if state.realkv != "none":
            if g.kv_words is None:
                raise ValueError(f"CanaryGroup(group={g.group}, half={g.half}).kv_words is required for "
                                 f"realkv={state.realkv!r}")
            if g.kv_words.dtype != torch.int64 or g.kv_words.stride(1) != 1:
                raise ValueError(f"CanaryGroup(group={g.group}, half={g.half}).kv_words must be int64 with unit "
                                 "stride along the row")
    if state.layout == "swa" and (state.swa_mapping is None or state.swa_window < 1):
        raise ValueError("layout 'swa' needs CanaryState.swa_mapping and swa_window >= 1")
    return spec


def _expected_tokens(state: CanaryState, plan: PlanInputs, kernel_name: str) -> tuple:
    """(EXPECTED mode, pointer, its row count, argument): 1 = the sampled-token table, read by the
    post-forward pass (argument: check this forward); 2 = the target's rows, read by the pre-forward
    pass of a draft worker (argument: the margin); 0 = no token check in this pass."""
    if state.sampled_tokens is not None and kernel_name == "canary_post_forward":
        return 1, state.sampled_tokens, state.sampled_tokens.shape[0], int(plan.check_sampled)
    if state.target_rows is not None and kernel_name == "canary_pre_forward" and plan.target_margin >= 0:
        return 2, state.target_rows, state.target_rows.shape[0], plan.target_margin
    return 0, state.req_to_token, 0, 0


class TritonCanaryOps:
    """The Triton backend behind ``get_ops``; identical results to ``reference.TorchCanaryOps``."""

    name = "triton"

    def __init__(self, block: int | None = None, programs: int | None = None, kernel_dir: Path | None = None,
                 num_warps: int | None = None, maxnreg: int | None = None, layer_chunk: int | None = None,
                 few_layers: int | None = None):
        _power_of_two("block", block, 2)
        _power_of_two("layer_chunk", layer_chunk, 1)
        _power_of_two("few_layers", few_layers, 1)
        self.block = block
        self.programs = programs
        self.num_warps = num_warps
        # Benchmarks only: cap registers per thread (more resident programs per multiprocessor).
        self.options = {} if maxnreg is None else {"maxnreg": int(maxnreg)}
        self.kernel_dir = Path(kernel_dir) if kernel_dir is not None else None
        # Benchmarks and tests: layers the post pass fingerprints at once (wide blocks, blocks of a few lanes).
        self.layer_chunk = layer_chunk
        self.few_layers = few_layers
        self._compiled: set = set()  # launch signatures whose every plan width is compiled

    def pre_forward(self, state: CanaryState, plan: PlanInputs, input_ids: torch.Tensor) -> None:
        spec = state_spec(state)
        if state.freed is not None:
            self.mark_freed(state, spec)
        self._launch("canary_pre_forward", state, plan, [input_ids], spec)

    def mark_freed(self, state: CanaryState, spec: Spec | None = None) -> None:
        """The allocator's frees noted since the last pass (``CanaryState.freed``), marked before it: inside the
        forward's graph when captured, so a replay marks them with no host work."""
        module = load_kernel_module(spec or state_spec(state), self.kernel_dir)
        full = [g.rows for g in state.groups if g.group == GROUP_FULL]
        capacity = state.freed.shape[0]
        module.canary_mark_freed[(triton.cdiv(capacity, MARK_BLOCK),)](
            state.freed, capacity, full[0].shape[0], *full, BLOCK=MARK_BLOCK)

    def post_forward(self, state: CanaryState, plan: PlanInputs) -> None:
        self._launch("canary_post_forward", state, plan, [])

    def _scratch(self, state: CanaryState, name: str, shape) -> torch.Tensor:
        value = getattr(state, name)
        if value is not None:
            return value
        key = f"_triton_scratch_{name}"
        if key not in state.extra:
            state.extra[key] = torch.zeros(shape, dtype=torch.int64, device=state.req_to_token.device)
        return state.extra[key]

    def _grid(self, device: torch.device, launch: Launch) -> int:
        if self.programs:
            return self.programs
        if device.type == "cuda":
            return torch.cuda.get_device_properties(device).multi_processor_count * launch.programs_per_sm
        return 4  # the interpreter runs programs one after another; each re-plans the batch

    def _launch(self, kernel_name: str, state: CanaryState, plan: PlanInputs, leading: list,
                spec: Spec | None = None) -> None:
        spec = spec or state_spec(state)
        module = load_kernel_module(spec, self.kernel_dir)
        kernel = getattr(module, kernel_name)
        fp_words = 0
        layer_chunk = few_layers = 1
        if spec.realkv != "none":
            words = state.groups[0].kv_words.shape[1]
            fp_words = min(PARTIAL_WORDS, words) if spec.realkv == "partial" else words
            # Whole rows (realkv=all) fill the tile with one layer already.
            if spec.realkv == "partial":
                count = _next_pow2(layers.layer_count(state.groups[0]))
                layer_chunk = self.layer_chunk or min(MAX_LAYER_CHUNK, count)
                few_layers = self.few_layers or min(MAX_FEW_LAYERS, count)
        launch = DEFAULT_LAUNCH[spec.realkv]
        block = self.block or launch.block
        expected_mode, expected, expected_len, expected_arg = _expected_tokens(state, plan, kernel_name)
        extend = plan.extend_lens if plan.extend_const == 0 else plan.prefix_lens  # unread when constant
        mark = plan.pad_mark
        args = list(leading) + [
            plan.num_reqs, plan.enabled, plan.req_pool_indices, plan.prefix_lens, extend, plan.extend_const,
            int(plan.prefix_is_end),
            mark if mark is not None else plan.req_pool_indices, int(mark is not None), plan.min_prefix,
            state.req_to_token, state.req_to_token.stride(0), state.groups[0].rows.shape[0],
            expected, expected_len, expected_arg, plan.target_window, int(plan.prefix_links),
        ]
        # Pre-forward of a target with a sampler: file the last sample into the table first.
        file_samples = kernel_name == "canary_pre_forward" and state.sample_staging is not None
        if file_samples:
            args += [state.sampled_tokens, state.sample_staging, state.sample_rows, state.sample_staging.shape[0]]
        else:
            args += [state.req_to_token, state.req_to_token, state.req_to_token, 0]
        ring = self._scratch(state, "ring", (1, 8))
        # Request identity and the write side: an int64 stand-in pointer where a check is off (never read).
        identity_mode = plan.identity if state.identity is not None else 0
        out_loc = plan.out_cache_loc
        args += [state.identity if identity_mode else ring, identity_mode,
                 out_loc if out_loc is not None else ring, int(out_loc is not None)]
        for g in state.groups:
            args.append(g.rows)
            if spec.realkv != "none":
                args += layer_args(g)
        if spec.layout == "swa":
            swa_rows = next(g.rows.shape[0] for g in state.groups if g.group == 1)
            args += [state.swa_mapping, swa_rows, state.swa_window]
        args.append(layers.cursor_table(state))
        args += [
            ring, self._scratch(state, "ring_count", (1,)),
            self._scratch(state, "counters", (4,)), self._scratch(state, "group_verified", (2,)),
        ]
        # The host-visible mirror (CanaryState.published): a pinned host tensor on CUDA, which Triton
        # passes by its device-mapped address. Without one, the publish is compiled out.
        publish = state.status is not None and state.published is not None and state.publish_done is not None
        if publish:
            n = state.status.shape[0]
            args += [state.status, n, state.published, state.published.shape[0] - n, state.publish_done]
        else:
            args += [ring, 0, ring, 1, ring]
        device = state.req_to_token.device
        options = dict(
            RING_SIZE=ring.shape[0],
            EXPECTED=expected_mode,
            FILE_SAMPLES=file_samples,
            BLOCK=block,
            FP_WORDS=fp_words,
            FP_CHUNK=min(MAX_FP_CHUNK, _next_pow2(max(1, fp_words))),
            LAYER_CHUNK=layer_chunk,
            FEW=min(FEW, block // 2),
            FEW_LAYERS=few_layers,
            PUBLISH=publish,
            STATUS_BLOCK=_next_pow2(state.status.shape[0]) if publish else 1,
            num_warps=self.num_warps or launch.num_warps,
            **self.options,
        )
        grid = (self._grid(device, launch),)
        try:
            if device.type == "cuda":
                # Dtypes differ by forward kind (decode reads positions, extend its prefix lengths), and
                # the rest of the signature is the state's own.
                signature = (kernel_name, id(state), expected_mode, file_samples, out_loc is None,
                             leading[0].dtype if leading else None, plan.req_pool_indices.dtype,
                             plan.prefix_lens.dtype, extend.dtype, None if mark is None else mark.dtype)
                if signature not in self._compiled:
                    self._compiled.add(signature)
                    compile_plan_widths(kernel, args, grid, options, state.req_to_token.shape[0] - 1)
            kernel[grid](*args, MAX_BS=plan_width(plan.num_reqs), **options)
        except Exception as exc:
            raise annotate(exc, [str((self.kernel_dir or kernels_dir()) / spec.filename)])
