"""``install_canary``: read the settings, attach canary rows to the KV pool, build the manager.

Returns None when the canary is off, so that the wiring costs one ``is None`` check.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from canary_instrument.runtime.setup.settings import load_settings, warn_unsupported_upstream

logger = logging.getLogger("canary_instrument.runtime")


def install_canary(*, server_args: Any, model_runner: Any, environ: Optional[Mapping[str, str]] = None):
    """The canary manager for ``model_runner`` (call right after its KV pool exists), or None when off."""
    settings = load_settings(server_args, environ)
    if not settings.enabled:
        return None
    warn_unsupported_upstream(server_args, environ)

    from canary_instrument.runtime.step.bracket import bracket_model_forward
    from canary_instrument.runtime.checks.distributed import find_process_group
    from canary_instrument.runtime.features.hicache import register_kv_pool
    from canary_instrument.runtime.step.expected_tokens import SampledTokens, find_target, register_target, wrap_sample
    from canary_instrument.runtime.manager import CanaryManager
    from canary_instrument.runtime.passes.ops import get_ops
    from canary_instrument.runtime.passes.layers import cursor_table
    from canary_instrument.runtime.setup.pools import attach_pool
    from canary_instrument.runtime.passes.state import CanaryState

    pool = _required(model_runner, "token_to_kv_pool")
    req_to_token = _required(_required(model_runner, "req_to_token_pool"), "req_to_token")
    model = _required(model_runner, "model")
    attached = attach_pool(
        pool,
        real_kv=settings.real_kv,
        window=getattr(model_runner, "sliding_window_size", None),
        allocator=getattr(model_runner, "token_to_kv_pool_allocator", None),
    )
    device = attached.groups[0].rows.device
    is_draft = bool(getattr(model_runner, "is_draft_worker", False))
    handed_out = _allocator_size(getattr(model_runner, "token_to_kv_pool_allocator", None))
    if is_draft and handed_out is not None and handed_out >= attached.groups[0].rows.shape[0]:
        # A draft that reads its target's pool and owns none of its own (frozen-KV MTP's is a placeholder of
        # a few slots): its canary rows could not hold the slots it reads, which the target's canary checks.
        logger.warning(
            "kv canary: the draft runner %s's KV pool holds %d slots but its allocator hands out %d: it reads "
            "a pool it does not own; no canary of its own (the target's checks that pool)",
            type(model_runner).__qualname__, attached.groups[0].rows.shape[0] - 1, handed_out,
        )
        return None
    if req_to_token.device != device:
        raise ValueError(f"kv canary: req_to_token is on {req_to_token.device} but the KV pool is on {device}")

    spec_steps = _speculative_num_steps(server_args)
    topk = getattr(server_args, "speculative_eagle_topk", None)
    if isinstance(topk, int) and not isinstance(topk, bool) and topk > 1:
        raise ValueError(
            f"kv canary: server_args.speculative_eagle_topk={topk}: the canary plans one new token per request "
            "and draft step; EAGLE draft trees (topk > 1) are not supported"
        )
    sampled, target_rows = None, None
    if settings.token_check and not is_draft and callable(getattr(model_runner, "sample", None)):
        sampled = SampledTokens(int(req_to_token.shape[0]), device)
    # An EAGLE draft's target: the manager of the runner sharing its req_to_token (the target installs first).
    target = find_target(req_to_token) if is_draft else None
    if settings.token_check and is_draft:
        if target is None:
            logger.warning(
                "kv canary: the draft runner %s found no target canary sharing its req_to_token (install the "
                "target first); its token check is off", type(model_runner).__qualname__,
            )
        elif not target.drafts:
            target_rows = target.state.groups[0].rows
        else:
            # Several draft runners on one target are the steps of a multi-layer EAGLE chain, installed in chain
            # order: step k's input ids are rotated k + 1 times, so its slot p holds token p + k + 1, while the
            # comparison reads the target's row of position p + 1 (the first draft runner's offset).
            logger.info(
                "kv canary: the draft runner %s is draft runner %d on its target (a multi-layer EAGLE chain step: "
                "slot p holds token p + %d); its rows are not compared with the target's, which hold token p + 1 "
                "at p", type(model_runner).__qualname__, len(target.drafts) + 1, len(target.drafts) + 1,
            )
    state = CanaryState(
        layout=attached.layout,
        realkv=settings.real_kv,
        groups=attached.groups,
        req_to_token=req_to_token,
        token_offset=1 if is_draft else 0,
        target_rows=target_rows,
        swa_mapping=attached.swa_mapping,
        swa_window=attached.swa_window,
    )
    if settings.real_kv == "partial":
        cursor_table(state)  # the rotation's per-request layer cursor, allocated before any graph capture
    side = None
    if not is_draft:
        from canary_instrument.runtime.checks.request_side import (
            RequestSide,
            make_freed_buffer,
            make_identity_table,
            wrap_allocators,
        )

        # Request identity needs the req-pool allocation wrapped (a new occupant's entry starts empty).
        state.identity = make_identity_table(req_to_token.shape[0], device)
        side = RequestSide(state)
        rows_wrapped, free_wrapped = wrap_allocators(model_runner, side)
        if not rows_wrapped:
            state.identity = None
            logger.warning("kv canary: %s has no alloc to wrap; the request-identity check is off",
                           type(model_runner.req_to_token_pool).__qualname__)
        if free_wrapped:
            state.freed = make_freed_buffer(req_to_token.shape[0], device)  # before any graph capture
        if not rows_wrapped and not free_wrapped:
            side = None
    manager = CanaryManager(
        settings=settings,
        state=state,
        ops=get_ops(device, None if settings.backend == "auto" else settings.backend),
        device=device,
        num_single_forward=max(1, spec_steps - 1),
        sampled_tokens=sampled,
        process_group=find_process_group(model_runner),
    )
    manager.request_side = side
    if target is not None:
        manager.steps.target = target.steps  # a draft's reports carry its target's step numbers
        target.drafts.append(manager)  # the target drives a draft that never ends its init (step/follower.py)
        if len(target.drafts) > 1:
            # Several draft runners on one target: the steps of a multi-layer EAGLE chain, each checked only where
            # that is sound for such a chain (plan.py, _chain_step). The runners' pools all exist before any of
            # their graphs is captured, so every captured plan knows it.
            for draft in target.drafts:
                draft.mark_chain_step()
    register_kv_pool(pool, manager)  # a HiCache host pool attached later finds these rows by its device pool
    if settings.jitter_max_us:
        from canary_instrument.runtime.features.jitter import install_jitter

        manager.jitter = install_jitter(manager, pool, settings)
    bracket_model_forward(model, manager)
    if settings.token_oracle and not is_draft:
        from canary_instrument.runtime.features.token_oracle import install_token_oracle

        # Before the sampled-token wrap: that one records the oracle's tokens, not the model's.
        install_token_oracle(model_runner, manager, settings, server_args)
    if sampled is not None:
        wrap_sample(model_runner, sampled)
    if not is_draft:
        register_target(req_to_token, manager)
    logger.info("kv canary installed: mode=%s real_data=%s pool=%s", settings.mode, settings.real_kv, attached.description)
    return manager


def _allocator_size(allocator: Any) -> Optional[int]:
    """How many slots a KV allocator hands out (its `size`), None when it does not say."""
    size = getattr(allocator, "size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _required(obj: Any, attr: str) -> Any:
    value = getattr(obj, attr, None)
    if value is None:
        raise ValueError(f"kv canary: {type(obj).__qualname__}.{attr} is missing; install_canary needs it")
    return value


def _speculative_num_steps(server_args: Any) -> int:
    steps = getattr(server_args, "speculative_num_steps", None)
    if steps is None:
        return 1
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"server_args.speculative_num_steps must be a non-negative integer; got {steps!r}")
    return steps
