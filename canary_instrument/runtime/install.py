"""``install_canary``: read the settings, attach canary rows to the KV pool, build the manager.

Returns None when the canary is off, so that the wiring costs one ``is None`` check.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from canary_instrument.runtime.settings import load_settings, warn_unsupported_upstream

logger = logging.getLogger("canary_instrument.runtime")


def install_canary(*, server_args: Any, model_runner: Any, environ: Optional[Mapping[str, str]] = None):
    """The canary manager for ``model_runner`` (call right after its KV pool exists), or None when off."""
    settings = load_settings(server_args, environ)
    if not settings.enabled:
        return None
    warn_unsupported_upstream(server_args, environ)

    from canary_instrument.runtime.bracket import bracket_model_forward
    from canary_instrument.runtime.distributed import find_process_group
    from canary_instrument.runtime.expected_tokens import ExpectedTokenTable
    from canary_instrument.runtime.manager import CanaryManager
    from canary_instrument.runtime.ops import get_ops
    from canary_instrument.runtime.pools import attach_pool
    from canary_instrument.runtime.state import CanaryState

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
    if req_to_token.device != device:
        raise ValueError(f"kv canary: req_to_token is on {req_to_token.device} but the KV pool is on {device}")

    spec_steps = _speculative_num_steps(server_args)
    max_reqs, max_context = int(req_to_token.shape[0]), int(req_to_token.shape[1])
    expected = None
    if settings.token_check:
        window = settings.token_window or spec_steps + 2
        expected = ExpectedTokenTable(max_reqs, max_context, device, window)
    state = CanaryState(
        layout=attached.layout,
        realkv=settings.real_kv,
        groups=attached.groups,
        req_to_token=req_to_token,
        expected_tokens=None,
        token_offset=1 if getattr(model_runner, "is_draft_worker", False) else 0,
        swa_mapping=attached.swa_mapping,
        swa_window=attached.swa_window,
    )
    manager = CanaryManager(
        settings=settings,
        state=state,
        ops=get_ops(device, None if settings.backend == "auto" else settings.backend),
        device=device,
        num_single_forward=max(1, spec_steps - 1),
        max_bs=max_reqs,
        expected_tokens=expected,
        process_group=find_process_group(model_runner),
    )
    bracket_model_forward(model, manager)
    logger.info("kv canary installed: mode=%s real_data=%s pool=%s", settings.mode, settings.real_kv, attached.description)
    return manager


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
