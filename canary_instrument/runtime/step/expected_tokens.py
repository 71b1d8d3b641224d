"""Expected tokens from what the engine already has on the device: no host token lists, no engine fields.

Two sources, one per kind of runner:

- Target runner: the sampler. ``model_runner.sample(logits_output, forward_batch)`` (sglang's
  ``ModelRunner.sample``) is wrapped on the instance; after it returns, one device copy stages the
  tokens, and the next pre-forward pass files them in a per-req-pool-row table (``SampledTokens``).
  That token is what the engine must feed back as the request's next input, so the post-forward pass of the
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
import weakref
from typing import Any, Optional

from canary_instrument.runtime.setup.instance_wrap import remember, unbind

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


class SampledTokens:
    """The target's sampled-token buffers (``CanaryState.sampled_tokens``, ``sample_staging``, ``sample_rows``).

    The table holds, per req-pool row, the token the sampler last produced for it (-1 = none). The host
    never writes it: a sample is one copy of the sampler's output into ``staging`` (in the batch's order),
    and the next pre-forward pass files it under the rows the sampled forward's own pre-forward pass left
    in ``rows``. The copy into a cached view costs less host time than an ``index_copy_`` by row
    (a probe since removed: ``git show c2b030b:bench/runtime/RESULTS.md``).
    """

    def __init__(self, max_reqs: int, device: Any):
        import torch

        # int32: token ids fit. sglang's samplers return int32, or int64 (greedy argmax): the copy converts.
        self.table = torch.full((int(max_reqs),), -1, dtype=torch.int32, device=device)
        self.staging = torch.full((int(max_reqs),), -1, dtype=torch.int32, device=device)
        self.rows = torch.zeros((int(max_reqs) + 1,), dtype=torch.int64, device=device)
        self.views: dict[int, Any] = {}  # batch size -> staging[:n], made once (``view``)
        self.recording = False  # set by the manager once init has finished: warm-up samples are skipped

    def view(self, n: int) -> Any:
        """``staging[:n]``, cached; None for more requests than req-pool rows (not a batch this pool served).
        A sample is one device op into it: ``view.copy_(next_token_ids)`` (``record``)."""
        view = self.views.get(n)
        if view is None and n <= self.staging.shape[0]:
            view = self.views[n] = self.staging[:n]
        return view

    def record(self, forward_batch: Any, next_token_ids: Any) -> None:
        """After ``model_runner.sample``: stage each request's sampled token (one device copy; the next
        pre-forward pass files it under the request's req-pool row). Skipped before init (warm-up samples)
        and for outputs that are not one token per request of the batch the forward ran."""
        if not self.recording:
            return
        # Plain attribute reads, no getattr with a default and no len() of a tensor (Tensor.__len__ is
        # Python): this runs after every sample with the host's caches cold, where each call costs.
        try:
            shape = next_token_ids.shape
            if len(shape) != 1 or shape[0] != forward_batch.req_pool_indices.shape[0]:
                return
        except AttributeError:  # no batch, no rows, or not a tensor
            return
        view = self.view(shape[0])
        if view is None:
            return
        view.copy_(next_token_ids)  # the one device op; the next pre-forward pass files it


def wrap_sample(model_runner: Any, sampled: SampledTokens) -> bool:
    """Wrap ``model_runner.sample`` (on the instance) so each sample is recorded; False when the
    runner has no ``sample`` method (then the target has no sampled-token check)."""
    original, owner = unbind(model_runner, "sample")
    if original is None:
        return False
    record = sampled.record
    if getattr(original, _SAMPLE_MARK, False):
        raise ValueError(
            f"kv canary: {type(model_runner).__qualname__}.sample is already wrapped by a canary"
        )

    def sample(logits_output: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if owner is None:
            next_token_ids = original(logits_output, forward_batch, *args, **kwargs)
        else:
            next_token_ids = original(owner(), logits_output, forward_batch, *args, **kwargs)
        record(forward_batch, next_token_ids)
        return next_token_ids

    # The original's name and doc, not its __wrapped__ (a bound method: a reference cycle, instance_wrap.py).
    functools.update_wrapper(sample, original, updated=())
    del sample.__wrapped__
    setattr(sample, _SAMPLE_MARK, True)
    remember(sample, original, owner)
    model_runner.sample = sample
    return True
