"""The expected-token table: what token each request's position must hold, filled outside the graph.

Rows are indexed by req-pool index, columns by position in target order (the EAGLE draft
worker reads column p + 1 for its slot p). -1 means unknown and is never checked. Filling
needs no host copy of ``req_pool_indices``: the host sends (batch row, column, token)
cells and the device scatters them through the batch's own ``req_pool_indices``.

The cells go into the runner's staging buffer (``staging.py``) and reach the device with the
plan in one copy; a step needing more cells than the staging region holds (an extend batch
of long rows) sends them in a second copy. Building the cells is vectorised numpy, apart from
one C-level slice per request of the engine's Python token lists.

Which cells are sent: an extend forward (where a request enters a req-pool row, possibly
inheriting a cached prefix) sends the whole known row; any other forward sends the last
``window`` known tokens, enough to cover what one step can add. Both send ``window + 1``
cells of -1 past the end, so what a previous owner of the row left there is cleared before
any verify can read it.
"""

from __future__ import annotations

import itertools
import operator
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
        self._overflow: Optional[np.ndarray] = None
        from canary_instrument.runtime.staging import BoundedCache

        self._cell_views = BoundedCache()
        self._row_grids = BoundedCache()
        # The last ``window`` tokens of a list in one C call (a tuple; a bare item when window is 1).
        self._tail = operator.itemgetter(*range(-self.window, 0))
        self._span_cols = np.arange(2 * self.window + 1, dtype=np.int64)

    def staging_cells(self, max_bs: int) -> int:
        """Cells the staging region holds: a full non-extend step of ``max_bs`` requests."""
        return int(max_bs) * (2 * self.window + 1)

    def stage(self, forward_batch: Any, full_rows: bool, out: np.ndarray) -> int:
        """Write this batch's cells into ``out`` (flat int64, packed [3, cells]); returns the cell count
        (0 without token ids). Cells that do not fit are kept for ``scatter`` to send separately."""
        self._overflow = None
        token_ids: Optional[Sequence[Sequence[int]]] = getattr(forward_batch, "canary_token_ids", None)
        if token_ids is None:
            return 0
        bs = int(forward_batch.batch_size)
        if len(token_ids) != bs:
            raise ValueError(
                f"kv canary: forward_batch.canary_token_ids has {len(token_ids)} rows for a batch of {bs} requests"
            )
        # Python ints first: the regular-step test is then two C-level builtins, not numpy reductions.
        lens_list = list(map(len, token_ids))
        if not full_rows and bs and self._regular(lens_list, out.size):
            return self._fill_regular(token_ids, lens_list, out)
        lens = np.array(lens_list, dtype=np.int64)
        n = self._cell_count(lens, full_rows)
        if n == 0:
            return 0
        if 3 * n <= out.size:
            cells = out[: 3 * n].reshape(3, n)
        else:
            cells = self._overflow = np.empty((3, n), dtype=np.int64)
        self._fill(token_ids, cells)
        return n

    def _regular(self, lens: list[int], room: int) -> bool:
        """Every request sends exactly ``window`` tokens and ``window + 1`` pads (the usual decode step)."""
        span = 2 * self.window + 1
        return (
            3 * span * len(lens) <= room
            and min(lens) >= self.window
            and max(lens) + self.window + 1 <= self.table.shape[1]
        )

    def _fill_regular(self, token_ids: Sequence[Sequence[int]], lens: list[int], out: np.ndarray) -> int:
        """The regular case as one [3, bs, 2 * window + 1] grid: a copy of a per-size template
        (batch rows, column offsets, pads), then the lengths and the token tails written in."""
        w, bs = self.window, len(lens)
        span = 2 * w + 1
        cells = out[: 3 * bs * span].reshape(3, bs, span)
        template = self._row_grids.get(bs)
        if template is None:
            template = np.empty((3, bs, span), dtype=np.int64)
            template[0] = np.arange(bs, dtype=np.int64)[:, None]
            template[1] = self._span_cols - w  # column = len - w + j
            template[2] = -1
            template = self._row_grids.put(bs, template)
        cells[...] = template
        cells[1] += np.array(lens, dtype=np.int64)[:, None]
        # _regular() checked every list holds at least ``window`` tokens, so each tail has exactly ``w``.
        tails = map(self._tail, token_ids)
        flat = tails if w == 1 else itertools.chain.from_iterable(tails)
        cells[2, :, :w] = np.fromiter(flat, dtype=np.int64, count=bs * w).reshape(bs, w)
        return bs * span

    def scatter(self, req_pool_indices: Any, staged: Any, n: int) -> None:
        """Write the ``n`` cells into the table (device ops only); ``staged`` is the device view of ``out``."""
        if n == 0:
            return
        import torch

        if self._overflow is not None:
            from canary_instrument.runtime.plan import to_device_async

            dev = to_device_async(torch.from_numpy(self._overflow), self.device)
            self._overflow = None
            batch_rows, cols, tokens = dev[0], dev[1], dev[2]
        else:
            views = self._cell_views.get(n)
            if views is None or views[0] is not staged:
                dev = staged[: 3 * n].view(3, n)
                views = self._cell_views.put(n, (staged, dev[0], dev[1], dev[2]))
            _, batch_rows, cols, tokens = views
        rows = req_pool_indices.index_select(0, batch_rows)
        self.table.index_put_((rows, cols), tokens)

    def _cell_count(self, lens: np.ndarray, full_rows: bool) -> int:
        width = self.table.shape[1]
        too_long = np.flatnonzero(lens > width)
        if too_long.size:
            b = int(too_long[0])
            raise ValueError(
                f"kv canary: canary_token_ids[{b}] has {int(lens[b])} tokens; the table holds {width} positions"
            )
        starts = np.zeros_like(lens) if full_rows else np.maximum(lens - self.window, 0)
        stops = np.minimum(lens + self.window + 1, width)
        self._spans = lens, starts, stops
        return int((stops - starts).sum())

    def _fill(self, token_ids: Sequence[Sequence[int]], cells: np.ndarray) -> None:
        """cells[0] batch row, cells[1] column, cells[2] token (-1 past each request's end)."""
        lens, starts, stops = self._spans
        known = lens - starts
        counts = stops - starts
        first = np.cumsum(counts) - counts
        batch_rows = np.repeat(np.arange(len(token_ids), dtype=np.int64), counts)
        within = np.arange(cells.shape[1], dtype=np.int64) - first[batch_rows]
        cells[0] = batch_rows
        np.add(starts[batch_rows], within, out=cells[1])
        cells[2] = -1
        tails = map(operator.getitem, token_ids, map(slice, starts.tolist(), lens.tolist()))
        values = np.fromiter(itertools.chain.from_iterable(tails), dtype=np.int64, count=int(known.sum()))
        cells[2][within < known[batch_rows]] = values
