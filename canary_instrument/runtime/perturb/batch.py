"""Facts of a forward batch that perturbations pick targets from, without reading the device.

Per request of the batch: how many leading positions this forward reads (and verifies) and how
many it writes. They come from the batch's host copies (sglang's ``extend_prefix_lens_cpu``,
``extend_seq_lens_cpu``, ``seq_lens_cpu``). A target verify may carry none of them (sglang's
spec-v2 worker with overlap scheduling publishes no host copy when the attention backend does not
need one): its prefix is then the device tensor ``seq_lens``, kept as ``device_prefix`` for the
kinds to draw from with device ops, while its width stays a host fact (the draft token count).
Any other batch without its host copies gets no batch perturbation; nothing is ever read back
from the device to find out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from canary_instrument.runtime.step.plan import draft_token_count


@dataclass(frozen=True)
class BatchFacts:
    mode: str  # "decode" | "extend" | "verify"
    # Per request: positions [0, prefix) exist before this forward and are read by it; None when only
    # the device knows them (``device_prefix``).
    prefix: Optional[tuple]
    new: tuple  # per request: positions [prefix, prefix + new) are written by it
    device_prefix: Any = None  # verify without host copies: the prefix per request, a device int tensor [size]

    @property
    def size(self) -> int:
        return len(self.new)

    @property
    def tokens(self) -> int:
        return sum(self.new)

    def token_owner(self, index: int) -> tuple[int, int]:
        """(request row, position) of the batch's ``index``-th new token, in batch order (host prefix only)."""
        for row, count in enumerate(self.new):
            if index < count:
                return row, self.prefix[row] + index
            index -= count
        raise IndexError(f"token {index} beyond the batch's {self.tokens} new tokens")


def _host_list(value: Any) -> Optional[list[int]]:
    if value is None:
        return None
    if hasattr(value, "tolist"):
        if getattr(value, "device", None) is not None and value.device.type != "cpu":
            return None  # a device tensor: reading it would synchronise
        value = value.tolist()
    return [int(v) for v in value]


def batch_facts(forward_batch: Any) -> Optional[BatchFacts]:
    """The batch's per-request facts, or None when it is idle or the facts it needs are missing."""
    if forward_batch is None:
        return None
    mode = forward_batch.forward_mode
    size = int(getattr(forward_batch, "batch_size", 0) or 0)
    if size == 0 or mode.is_idle():
        return None
    seq_lens = _host_list(getattr(forward_batch, "seq_lens_cpu", None))
    if mode.is_target_verify():
        # sglang reports the prefix as seq_lens for a verify; every request scores the same draft width,
        # which real sglang declares on spec_info (draft_token_num), not as num_tokens_per_req.
        width = draft_token_count(forward_batch)
        if width < 1:
            return None
        prefix = seq_lens or _host_list(getattr(forward_batch, "extend_prefix_lens_cpu", None))
        if prefix is not None:
            return BatchFacts("verify", tuple(prefix[:size]), (width,) * size)
        device_prefix = getattr(forward_batch, "seq_lens", None)
        if device_prefix is None:
            return None
        return BatchFacts("verify", None, (width,) * size, device_prefix=device_prefix[:size])
    if mode.is_decode():
        if seq_lens is None:
            return None
        return BatchFacts("decode", tuple(n - 1 for n in seq_lens[:size]), (1,) * size)
    prefix = _host_list(getattr(forward_batch, "extend_prefix_lens_cpu", None))
    new = _host_list(getattr(forward_batch, "extend_seq_lens_cpu", None))
    if prefix is None or new is None:
        return None
    return BatchFacts("extend", tuple(prefix[:size]), tuple(new[:size]))


def planned_before_the_forward(forward_batch: Any) -> bool:
    """Whether the batch says its forward was prepared before the forward site (sglang's
    ``needs_forward_metadata_init()`` is False: a spec-v2 target verify whose CUDA graph's static buffers, write
    locations included, the plan stream loaded ahead of ``ModelRunner.forward``). Such a forward reads the copies
    made then: a kind that rewrites a batch tensor the engine does not copy again (``out_cache_loc``) changes
    nothing it reads. A batch that says nothing is prepared at the site."""
    needs_init = getattr(forward_batch, "needs_forward_metadata_init", None)
    if not callable(needs_init):
        return False
    try:
        return not needs_init()
    except Exception:  # noqa: BLE001 - a batch that cannot tell is taken as prepared at the site
        return False
