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
        width = self.table.shape[1]
        pad = self.window + 1
        batch_rows, cols, values = [], [], []
        for b, tokens in enumerate(token_ids):
            n = len(tokens)
            if n > width:
                raise ValueError(
                    f"kv canary: canary_token_ids[{b}] has {n} tokens; the table holds {width} positions"
                )
            start = 0 if full_rows else max(0, n - self.window)
            stop = min(width, n + pad)
            row = np.full(stop - start, -1, dtype=np.int64)
            row[: n - start] = np.asarray(tokens[start:n], dtype=np.int64)
            batch_rows.append(np.full(stop - start, b, dtype=np.int64))
            cols.append(np.arange(start, stop, dtype=np.int64))
            values.append(row)
        if not values:
            return np.zeros((3, 0), dtype=np.int64)
        return np.stack([np.concatenate(batch_rows), np.concatenate(cols), np.concatenate(values)])

    def _scatter(self, req_pool_indices: Any, cells: np.ndarray) -> None:
        import torch

        from canary_instrument.runtime.plan import to_device_async

        dev = to_device_async(torch.from_numpy(cells), self.device)
        rows = req_pool_indices.to(torch.int64).index_select(0, dev[0])
        self.table.index_put_((rows, dev[1]), dev[2])
