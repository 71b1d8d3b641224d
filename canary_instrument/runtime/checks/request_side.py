"""Host side of the request-identity and freed-slot checks: wrappers on the engine's allocators.

The identity table (``CanaryState.identity``, one entry per req-pool row) must start empty for each
new occupant of a row, and a KV slot the allocator frees must read as freed to any request that
still reads it. Both are engine events on the host: the req-pool row allocation (sglang's
``ReqToTokenPool.alloc_rows``, else ``alloc``) and the KV free (``TokenToKVPoolAllocator.free``; on
an SWA allocator its full-attention allocator's, which every full free goes through). They are
wrapped on the instance and only noted; the marks are made by the target's next forward, on its
stream. So the previous occupant's last forward and the finishing request's in-flight forward
(enqueued before the event, as sglang's overlap scheduler does) never see them, and the next
forward that could read the row or slot does.

Frees can come every step (an engine that frees each step's rejected drafts, as the ngram, DFlash and
frozen-KV MTP verifies of sglang 0.5.13 do; its spec v2 workers keep them for the next window instead):
each is noted as one copy of its slots into ``CanaryState.freed`` (on the stream current at the free),
a fixed device buffer that every pre-forward op empties into the rows before its pass, inside the
forward's CUDA graph when captured, so a free costs the host one device op. A free that does not fit
the buffer, and every req-pool allocation, is applied by ops at the entry of the next forward site
instead.
"""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.setup.instance_wrap import wrap_call
from canary_instrument.runtime.passes.state import FREED_POSITION, GROUP_FULL

_MARK = "__kv_canary_request_side__"


class RequestSide:
    """Allocations and frees noted since the last forward, applied by ``apply`` before the next one."""

    def __init__(self, state: Any):
        self.state = state
        self.new_rows: list = []  # req-pool rows handed to new requests (ints, or device tensors)
        self.freed: list = []  # device tensors of freed KV slots that did not fit state.freed (copies)
        self.offset = 0  # entries of state.freed appended since the last forward's entry
        self.pending = False

    def after_alloc(self, args: tuple, kwargs: dict, rows: Any) -> Any:
        """The wrapped row allocation's note (``instance_wrap.wrap_call``): its result is the rows."""
        self.on_alloc(rows)
        return rows

    def after_free(self, args: tuple, kwargs: dict, result: Any) -> Any:
        """The wrapped KV free's note: its first argument (``free_index``) is the slots."""
        self.on_free(args[0] if args else kwargs.get("free_index"))
        return result

    def on_alloc(self, rows: Any) -> None:
        if rows is None or self.state.identity is None:
            return
        if hasattr(rows, "clone"):
            self.new_rows.append(rows.reshape(-1).clone())
        elif len(rows):
            self.new_rows.extend(int(r) for r in rows)
        self.pending = bool(self.new_rows) or bool(self.freed)

    def on_free(self, free_index: Any) -> None:
        try:
            n = free_index.numel()
        except AttributeError:  # None, or not a tensor: nothing the device can mark
            return
        if n == 0:
            return
        buffer, offset = self.state.freed, self.offset
        if buffer is not None and offset + n <= buffer.shape[0]:
            buffer[offset : offset + n].copy_(free_index.reshape(-1))  # one device op; the next pass marks them
            self.offset = offset + n
        else:  # no room: a copy, marked at the next forward's entry (apply)
            import torch

            self.freed.append(free_index.reshape(-1).to(dtype=torch.int64, copy=True))
        self.pending = True

    def apply(self) -> None:
        """Enqueue the noted resets and freed marks on the current (the forward's) stream."""
        self.offset = 0  # the buffer's entries: marked by this forward's pre-forward op, before its pass
        self.pending = False
        import torch

        state = self.state
        rows, self.new_rows = self.new_rows, []
        freed, self.freed = self.freed, []
        if rows and state.identity is not None:
            device = state.identity.device
            ints = [r for r in rows if isinstance(r, int)]
            tensors = [r.to(device=device, dtype=torch.int64) for r in rows if not isinstance(r, int)]
            if ints:
                tensors.append(_host_to_device(ints, device))
            state.identity.index_fill_(0, torch.cat(tensors), -1)
        if freed:
            mark_freed(state, freed[0] if len(freed) == 1 else torch.cat(freed))


def mark_freed(state: Any, slots: Any) -> None:
    """Make the FULL group's rows of ``slots`` (a device int tensor) read as freed; the FULL group verifies
    every position an SWA request reads, so the SWA group's rows are left alone."""
    import torch

    full = [g for g in state.groups if g.group == GROUP_FULL]
    n = full[0].rows.shape[0]
    slots = slots.to(device=full[0].rows.device, dtype=torch.int64)
    # Out-of-range entries go to slot 0, the padding row nobody verifies (no host sync to drop them).
    slots = torch.where((slots > 0) & (slots < n), slots, 0)
    for group in full:
        group.rows[:, 1].index_fill_(0, slots, FREED_POSITION)


def _host_to_device(values: list, device: Any) -> Any:
    import torch

    host = torch.tensor(values, dtype=torch.int64)
    if torch.device(device).type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def wrap_allocators(model_runner: Any, side: RequestSide) -> tuple[bool, bool]:
    """Wrap the req-pool row allocation and the KV free; returns (rows wrapped, free wrapped)."""
    pool = getattr(model_runner, "req_to_token_pool", None)
    rows_wrapped = False
    if pool is not None:
        name = "alloc_rows" if callable(getattr(pool, "alloc_rows", None)) else "alloc"
        rows_wrapped = wrap_call(pool, name, side.after_alloc, _MARK)
    allocator = getattr(model_runner, "token_to_kv_pool_allocator", None)
    allocator = getattr(allocator, "full_attn_allocator", None) or allocator
    free_wrapped = False
    if allocator is not None:
        free_wrapped = wrap_call(allocator, "free", side.after_free, _MARK)
    return rows_wrapped, free_wrapped


# Entries of the freed-slot buffer per req-pool row: room for a step that frees this many slots per request
# (rejected drafts); a larger free is marked at the next forward's entry instead.
FREED_PER_ROW = 8
MIN_FREED_CAPACITY = 4096


def make_freed_buffer(req_pool_rows: int, device: Any) -> Any:
    import torch

    capacity = max(MIN_FREED_CAPACITY, FREED_PER_ROW * int(req_pool_rows))
    return torch.zeros(capacity, dtype=torch.int64, device=device)


def make_identity_table(rows: int, device: Any) -> Optional[Any]:
    import torch

    from canary_instrument.runtime.passes.state import IDENTITY_FIELDS

    return torch.full((int(rows), IDENTITY_FIELDS), -1, dtype=torch.int64, device=device)
