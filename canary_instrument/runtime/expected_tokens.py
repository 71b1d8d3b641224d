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


# The inbox reads the sampler's tensors by address when the next forward runs, so the tokens must
# not change in between. A sampler that returns new tensors (sglang's) never hands back one the
# canary still holds; one that returns a buffer it rewrites (the same tensor, or views of one
# persistent output, or a few of them in turn) does, and from then on each sample is copied (one
# device op). Told apart by identity: the tensor, or the tensor it is a view of, against the last
# samples', which the canary keeps alive so that no new tensor can take their place. The first
# samples are copied while there is nothing to compare with yet. (The req-pool rows are the forward
# batch's own tensor, which an engine may keep from step to step while the batch is unchanged:
# that is not a rewrite, and they are read in place.)
_PROBATION = 2
_RECENT = 4


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
        self._cuda = self.table.is_cuda
        self._int32, self._int64 = torch.int32, torch.int64
        self._recent = [None] * _RECENT  # the last samples' token tensors (or the tensors they view)
        self._recent_ids = [0] * _RECENT
        self._next = 0
        self._snapshots_left = _PROBATION
        self.snapshot_every_sample = False  # set once the sampler was seen handing back a tensor again

    def record(self, req_pool_indices: Any, next_token_ids: Any, tag: int, forwards_done: int) -> bool:
        """Queue ``table[req_pool_indices[b]] = next_token_ids[b]`` for every request b, filed by the
        first pre-forward pass of forward index >= ``tag``; False when the inbox dropped it."""
        rows, tokens = req_pool_indices, next_token_ids
        int32, int64 = self._int32, self._int64
        dtype = tokens.dtype
        if (dtype is not int32 and dtype is not int64) or tokens.is_cuda is not self._cuda:
            tokens = tokens.to(self.table.device, int32)
        dtype = rows.dtype
        if (dtype is not int32 and dtype is not int64) or rows.is_cuda is not self._cuda:
            rows = rows.to(self.table.device, int64)
        if not self.snapshot_every_sample:
            base = tokens._base
            if base is None:
                base = tokens
            if id(base) in self._recent_ids:
                self.snapshot_every_sample = True
                self._recent = self._recent_ids = []
                logger.info("kv canary: the sampler hands back a tensor it returned before; each sample is "
                            "copied from now on")
            else:
                i = self._next
                self._recent[i] = base
                self._recent_ids[i] = id(base)
                self._next = (i + 1) % _RECENT
        if self.snapshot_every_sample or self._snapshots_left:
            if self._snapshots_left:
                self._snapshots_left -= 1
            tokens = tokens.clone()
        return self.inbox.send(rows, tokens, tag, forwards_done)


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
