"""Per-forward plans taken from the forward batch's own device tensors, inside the bracket.

The bracketed ``model.forward`` receives the ForwardBatch (inside a CUDA graph: the graph
runner's static buffers). Its plan is a choice of those tensors plus a few host constants of
the forward's shape (the batch size, a fixed extend length), so a captured graph re-reads the
plan at every replay and the host sends nothing per step. The conventions follow sglang's
(``kv_canary/plan_input.py`` upstream):

| forward | prefix (verified) | new positions (written) |
|---|---|---|
| decode, EAGLE draft step (seq_lens stay pre-bump, positions advance) | ``positions`` | 1 |
| target verify | ``seq_lens`` | draft tokens per request |
| extend, mixed, draft-extend | ``extend_prefix_lens`` (else ``seq_lens - extend_seq_lens``) | ``extend_seq_lens`` |
"""

from __future__ import annotations

import functools
from typing import Any

from canary_instrument.runtime.errors import CanaryWiringError
from canary_instrument.runtime.passes.state import IDENTITY_FIRST_NEW, IDENTITY_LAST_NEW, IDENTITY_OFF, PlanInputs

DECODE = "decode"
EXTEND = "extend"
TARGET_VERIFY = "target_verify"
IDLE = "idle"


def forward_kind(forward_batch: Any) -> str:
    """Which plan convention applies; target-verify first because sglang counts it as an extend."""
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None:
        raise ValueError(f"kv canary: forward batch {type(forward_batch).__qualname__} has no forward_mode")
    if not getattr(forward_batch, "batch_size", 0):
        return IDLE
    try:  # keyed by type too: IntEnum modes of different engines compare equal to each other's ints
        return _cached_kind(type(mode), mode)
    except TypeError:  # a mode that cannot be a dict key
        return _kind_of(mode)


@functools.lru_cache(maxsize=None)
def _cached_kind(mode_type: type, mode: Any) -> str:
    return _kind_of(mode)


def _mode_is(mode: Any, name: str) -> bool:
    """``mode.<name>()``, False where the mode has no such method (engines' modes differ by release)."""
    check = getattr(mode, name, None)
    return bool(check()) if callable(check) else False


def _kind_of(mode: Any) -> str:
    def is_(name: str) -> bool:
        return _mode_is(mode, name)

    if is_("is_idle"):
        return IDLE
    if is_("is_target_verify"):
        return TARGET_VERIFY
    if is_("is_draft_extend_v2") or is_("is_draft_extend") or is_("is_extend"):
        return EXTEND
    if is_("is_decode"):
        return DECODE
    raise ValueError(f"kv canary: unsupported forward mode {mode!r}")


def draft_token_count(forward_batch: Any) -> int:
    """Draft tokens per request of a target-verify batch: declared by the batch, else tokens / requests."""
    count = getattr(forward_batch, "num_tokens_per_req", None)
    if count is None:
        count = getattr(getattr(forward_batch, "spec_info", None), "draft_token_num", None)
    if count is None:
        count = int(forward_batch.input_ids.shape[0]) // int(forward_batch.batch_size)
    return int(count)


def plan_from_batch(forward_batch: Any, enabled: Any, *, index: int = 0, draft: bool = False,
                    chain: bool = False) -> PlanInputs | None:
    """The plan of sub-forward ``index`` over ``forward_batch``, or None for an idle batch (nothing to do).

    Host work only (attribute reads); every tensor of the plan is one the batch already holds.
    ``draft``: the runner is an EAGLE draft worker, whose decode step ``index`` may compare its
    rows only below ``prefix - (index + 1)`` with the target's (the bonus token and the chain's
    own guesses are not in the target's cache yet), and whose graph padding is told by the batch
    (``_draft_padding``). ``chain``: the draft runner is one step of a multi-layer EAGLE chain
    (several draft runners on one target), whose rows are only checked where that is sound
    (``_chain_step``).
    """
    if forward_batch is None:
        raise CanaryWiringError(
            "kv canary: the bracketed model.forward got no forward batch (third argument or forward_batch=); "
            "the canary plans every forward from it"
        )
    kind = forward_kind(forward_batch)
    if kind == IDLE:
        return None
    plan = _plan(forward_batch, kind, enabled, index, draft)
    if not draft:
        # Request identity and the write side (target only: a draft worker's rows past the target's are
        # guesses its draft-extend rewrites, and its draft steps' out_cache_loc is not one slot per input id).
        plan.identity = IDENTITY_FIRST_NEW if kind == TARGET_VERIFY else IDENTITY_LAST_NEW
        plan.out_cache_loc = getattr(forward_batch, "out_cache_loc", None)
    else:
        plan.identity = IDENTITY_OFF
        _draft_padding(plan, forward_batch)
        if chain:
            after_verify = kind == EXTEND and _is_draft_extend(forward_batch.forward_mode)
            _chain_step(plan, kind, after_verify)
    return plan


def _is_draft_extend(mode: Any) -> bool:
    """A draft-extend forward (the draft's extend after a target verify), as opposed to a plain extend (a
    prefill or a chunk of one, which a draft worker also runs over the target's batch)."""
    return _mode_is(mode, "is_draft_extend_v2") or _mode_is(mode, "is_draft_extend")


def _draft_padding(plan: PlanInputs, forward_batch: Any) -> None:
    """Graph padding on a draft runner, told by the batch itself, not by req-pool row 0: sglang's multi-layer
    draft-extend graph (0.5.13-0.5.19) pads a batch with rows that keep a stale, live req-pool index of an
    earlier replay (0.5.17: ``fill_draft_extend_prepare_buffers_kernel`` stores the index for real rows only)
    and whose ``seq_lens`` is the attention backend's fill value (1 on FlashInfer, FA3, Triton). Such a row is
    marked by its accept count (``spec_info.num_accept_tokens`` = -1, 0.5.16 on; a real row's count is at least
    1) and by its length: its prefix ``seq_lens - extend_seq_lens`` is negative, which no request's is."""
    mark = getattr(getattr(forward_batch, "spec_info", None), "num_accept_tokens", None)
    shape = getattr(mark, "shape", None)
    if shape is not None and len(shape) == 1 and shape[0] >= plan.num_reqs:
        plan.pad_mark = mark
    plan.min_prefix = 0


def _chain_step(plan: PlanInputs, kind: str, after_verify: bool) -> None:
    """A step of a multi-layer EAGLE chain (docs/runtime.md section 4, sglang 0.5.17's
    ``MultiLayerEagleDraftWorker``): its rows for one prompt differ between requests (a non-final prefill
    chunk's draft input ends with the chunk's discarded sample), so the links of the prefix it reads are not
    checked (the prefix cache re-points a request's positions at another request's rows of the same prompt),
    and the token comparison with the target is made only where a verify's first input lands: the last
    position before a draft-extend's new ones (a prefill's or chunk's draft-extend compares nothing)."""
    plan.prefix_links = False
    if plan.target_margin < 0:
        return
    if kind == EXTEND and not after_verify:
        plan.target_margin = -1
    else:
        plan.target_window = 1


def _plan(forward_batch: Any, kind: str, enabled: Any, index: int, draft: bool) -> PlanInputs:
    bs = int(forward_batch.batch_size)
    rpi = forward_batch.req_pool_indices
    if kind == DECODE:
        positions = forward_batch.positions
        if positions.shape[0] != bs:
            raise CanaryWiringError(
                f"kv canary: a decode batch of {bs} requests has {positions.shape[0]} positions; the canary "
                "plans one new token per request (EAGLE topk > 1 draft trees are not supported)"
            )
        return PlanInputs(bs, rpi, positions, None, enabled, extend_const=1, check_sampled=not draft,
                          target_margin=index + 1 if draft else -1)
    if kind == TARGET_VERIFY:
        return PlanInputs(bs, rpi, forward_batch.seq_lens, None, enabled, extend_const=draft_token_count(forward_batch),
                          target_margin=0 if draft else -1)
    extend = forward_batch.extend_seq_lens
    prefix = getattr(forward_batch, "extend_prefix_lens", None)
    if prefix is not None:
        return PlanInputs(bs, rpi, prefix, extend, enabled, target_margin=0 if draft else -1)
    # sglang's draft-extend graph replay passes extend_seq_lens but no extend_prefix_lens.
    return PlanInputs(bs, rpi, forward_batch.seq_lens, extend, enabled, prefix_is_end=True,
                      target_margin=0 if draft else -1)
