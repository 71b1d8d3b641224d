"""Expected tokens from what the engine already has on the device: no host token lists, no engine fields.

Two sources, one per kind of runner:

- Target runner: the sampler. ``model_runner.sample(logits_output, forward_batch)`` (sglang's
  ``ModelRunner.sample``) is wrapped on the instance; after it returns, each request's sampled
  token is bound for a per-req-pool-row table (``SampledTokens``): the host queues the sampler's
  own tensors by address (no device op, sample_inbox.py) and the next pre-forward pass files
  them into the table on the device. That token is
  what the engine must feed back as the request's next input, so the post-forward pass of the
  next decode compares the row it wrote at the request's first new position with it. Every
  post-forward pass consumes the entries of its requests, so an entry is only ever compared by
  the forward right after the sample that wrote it: a chunked prefill's discarded sample, the
  sample of a request that finished, or one followed by a target verify (EAGLE decodes through
  the verify, not the sampler) is gone before any decode could read it.
- EAGLE draft runner: the target's canary rows. Draft slot p holds token p + 1, and the draft
  shares the target's ``req_to_token`` and slot numbers, so the draft's pre-forward pass compares
  the token of its row of position p with the target's row of position p + 1 where the target
  has written and kept it. The target manager is found through a registry keyed on the shared
  ``req_to_token`` tensor (the target installs first).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections import deque
from typing import Any, Optional

logger = logging.getLogger(__name__)

_SAMPLE_MARK = "__kv_canary_sample_wrapped__"

# id(req_to_token) -> weak references to that tensor and to the target (non-draft) manager reading it.
# Weak both ways (tensors compare element-wise, so they cannot be dict keys): an engine that is
# freed leaves nothing behind, and a reused id is told apart by the tensor reference.
_TARGETS: dict[int, tuple[weakref.ReferenceType, weakref.ReferenceType]] = {}


def register_target(req_to_token: Any, manager: Any) -> None:
    """Make ``manager`` the target an EAGLE draft runner sharing ``req_to_token`` checks against."""
    for key, (tensor, target) in list(_TARGETS.items()):
        if tensor() is None or target() is None:
            del _TARGETS[key]
    _TARGETS[id(req_to_token)] = (weakref.ref(req_to_token), weakref.ref(manager))


def find_target(req_to_token: Any) -> Optional[Any]:
    """The live target manager registered for ``req_to_token``, or None."""
    found = _TARGETS.get(id(req_to_token))
    if found is None or found[0]() is not req_to_token:
        return None
    return found[1]()


# The inbox reads the sampler's tensors by address when the next forward runs, so they must not
# change in between. A sampler that returns fresh tensors (sglang's) never shares memory with
# earlier samples the canary still holds; one that hands back a buffer it rewrites (a view of a
# persistent output, double buffering) does, and from then on each sample is snapshotted (one
# device copy). The first samples are snapshotted while there is nothing to compare with yet.
_PROBATION = 2
_RECENT = 4  # earlier samples a new one is compared with (and held, so no fresh tensor can reuse their memory)


class SampledTokens:
    """int32 [max_reqs]: the token the sampler last produced for each req-pool row; -1 = none.

    Filled on the device: ``record`` only queues the sampler's own tensors in the sample inbox
    (sample_inbox.py, no device op), and the next pre-forward pass files them into the table."""

    def __init__(self, max_reqs: int, device: Any):
        import torch

        from canary_instrument.runtime.sample_inbox import SampleInbox

        # int32: sglang's samplers return int32 token ids (int64 is read as its low word).
        self.table = torch.full((int(max_reqs),), -1, dtype=torch.int32, device=device)
        self.inbox = SampleInbox(device)
        self._device = self.table.device
        self._kinds = (torch.int32, torch.int64)
        self._recent: deque = deque(maxlen=_RECENT)  # (spans, rows, tokens) of the last samples
        self._snapshots_left = _PROBATION
        self.snapshot_every_sample = False  # set once the sampler was seen reusing memory

    def record(self, req_pool_indices: Any, next_token_ids: Any, tag: int, forwards_done: int) -> bool:
        """Queue ``table[req_pool_indices[b]] = next_token_ids[b]`` for every request b, filed by the
        first pre-forward pass of forward index >= ``tag``; False when the inbox dropped it."""
        rows, tokens = req_pool_indices, next_token_ids
        if tokens.dtype not in self._kinds or tokens.device != self._device:
            tokens = tokens.to(self._device, self.table.dtype)
        if rows.dtype not in self._kinds or rows.device != self._device:
            rows = rows.to(self._device, self.table.dtype)
        if not self.snapshot_every_sample:
            spans = _span(rows) + _span(tokens)
            for earlier in self._recent:
                if _overlap(spans, earlier[0]):
                    self.snapshot_every_sample = True
                    self._recent.clear()
                    logger.info("kv canary: the sampler reuses its output memory; each sample is copied from now on")
                    break
            else:
                self._recent.append((spans, rows, tokens))
        if self.snapshot_every_sample or self._snapshots_left:
            if self._snapshots_left:
                self._snapshots_left -= 1
            rows, tokens = rows.clone(), tokens.clone()
        return self.inbox.send(rows, tokens, tag, forwards_done)


def _span(t: Any) -> tuple[int, int]:
    """The bytes a 1-D tensor reaches: [first, last]."""
    start = t.data_ptr()
    return start, start + max(0, t.shape[0] - 1) * t.stride(0) * t.element_size() + t.element_size() - 1


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether any span of ``a`` (rows, tokens) meets any span of ``b``."""
    for i in (0, 2):
        for j in (0, 2):
            if a[i] <= b[j + 1] and b[j] <= a[i + 1]:
                return True
    return False


def wrap_sample(model_runner: Any, manager: Any) -> bool:
    """Wrap ``model_runner.sample`` (on the instance) so each sample is recorded; False when the
    runner has no ``sample`` method (then the target has no sampled-token check)."""
    original = getattr(model_runner, "sample", None)
    if original is None or not callable(original):
        return False
    if getattr(original, _SAMPLE_MARK, False):
        raise ValueError(
            f"kv canary: {type(model_runner).__qualname__}.sample is already wrapped by a canary"
        )

    @functools.wraps(original)
    def sample(logits_output: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        next_token_ids = original(logits_output, forward_batch, *args, **kwargs)
        manager.record_sampled(forward_batch, next_token_ids)
        return next_token_ids

    setattr(sample, _SAMPLE_MARK, True)
    sample.__wrapped_original__ = original
    model_runner.sample = sample
    return True


def unwrap_sample(model_runner: Any) -> None:
    """Undo ``wrap_sample`` (tests, and engines that rebuild their runner)."""
    sample = model_runner.__dict__.get("sample")
    if sample is not None and getattr(sample, _SAMPLE_MARK, False):
        del model_runner.sample
