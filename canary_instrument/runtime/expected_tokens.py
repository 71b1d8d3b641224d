"""The expected-token table: what token each request's position must hold, filled outside the graph.

Rows are indexed by req-pool index, columns by position in target order (the EAGLE draft
worker reads column p + 1 for its slot p). -1 means unknown and is never checked. Filling
needs no host copy of ``req_pool_indices``: the host sends (batch row, column, token)
cells and the device scatters them through the batch's own ``req_pool_indices``.

Which cells are sent: an extend forward (where a request enters a req-pool row, possibly
inheriting a cached prefix) sends the whole known row; any other forward sends the last
``window`` known tokens, enough to cover what one step can add. Both send ``window + 1``
cells of -1 past the end, so what a previous owner of the row left there is cleared before
any verify can read it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np


class ExpectedTokenTable:
    def __init__(self, max_reqs: int, max_context: int, device: Any, window: int):
        import torch

        if window < 1:
            raise ValueError(f"kv canary: expected-token window must be >= 1, got {window}")
        self.table = torch.full((max_reqs, max_context + 1), -1, dtype=torch.int64, device=device)
        self.window = int(window)
        self.device = torch.device(device)

    def update(self, forward_batch: Any, full_rows: bool) -> int:
        """Send this batch's known tokens; returns the number of cells sent (0 without token ids)."""
        token_ids: Optional[Sequence[Sequence[int]]] = getattr(forward_batch, "canary_token_ids", None)
        if token_ids is None:
            return 0
        bs = int(forward_batch.batch_size)
        if len(token_ids) != bs:
            raise ValueError(
                f"kv canary: forward_batch.canary_token_ids has {len(token_ids)} rows for a batch of {bs} requests"
            )
        cells = self._cells(token_ids, full_rows)
        if cells.shape[1] == 0:
            return 0
        self._scatter(forward_batch.req_pool_indices, cells)
        return int(cells.shape[1])

    def _cells(self, token_ids: Sequence[Sequence[int]], full_rows: bool) -> np.ndarray:
        """int64 [3, cells]: batch row, column, token (-1 past each request's end)."""
        width = self.table.shape[1]
        pad = self.window + 1
        lens = np.fromiter((len(t) for t in token_ids), dtype=np.int64, count=len(token_ids))
        too_long = np.flatnonzero(lens > width)
        if too_long.size:
            b = int(too_long[0])
            raise ValueError(
                f"kv canary: canary_token_ids[{b}] has {int(lens[b])} tokens; the table holds {width} positions"
            )
        starts = np.zeros_like(lens) if full_rows else np.maximum(lens - self.window, 0)
        stops = np.minimum(lens + pad, width)
        values: list[int] = []
        for tokens, start, n, stop in zip(token_ids, starts.tolist(), lens.tolist(), stops.tolist()):
            values.extend(tokens[start:n])
            values.extend([-1] * (stop - n))
        counts = stops - starts
        batch_rows = np.repeat(np.arange(len(token_ids), dtype=np.int64), counts)
        first = np.cumsum(counts) - counts
        cols = starts[batch_rows] + np.arange(batch_rows.size, dtype=np.int64) - first[batch_rows]
        return np.stack([batch_rows, cols, np.asarray(values, dtype=np.int64)])

    def _scatter(self, req_pool_indices: Any, cells: np.ndarray) -> None:
        import torch

        from canary_instrument.runtime.plan import to_device_async

        dev = to_device_async(torch.from_numpy(cells), self.device)
        rows = req_pool_indices.to(torch.int64).index_select(0, dev[0])
        self.table.index_put_((rows, dev[1]), dev[2])
