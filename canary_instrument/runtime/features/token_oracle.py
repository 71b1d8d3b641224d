"""Token oracle: a sampler that emits ``hash(seed, request, position) % vocab``, and the check of every written input.

With the oracle on, the token at every position past a request's prompt is a pure function of the
request and the position, so the canary knows the expected input token of every position of every
request and checks each written position's input id when the forward writes it: decodes, extends,
mixed batches (decodes riding in a chunked prefill), a retracted request's re-prefill of its own
outputs. Upstream's oracle (sglang 0.5.23 ``kv_canary/token_oracle``) checks decode inputs only: every
extend-like forward takes its own ``input_ids`` as the expectation.

The hash is upstream's ``HashOracle``: ``token = mix64(rid ^ position ^ S) mod vocab`` on uint64, with
``mix64`` the splitmix64 finalizer, ``rid`` upstream's request id (the PD bootstrap room when set, else
the first 8 bytes of blake2b of ``req.rid``, little-endian signed) and ``S = 0`` for seed 0 (upstream's
tokens exactly) or ``mix64(seed)`` otherwise.

Per req-pool row the oracle keeps two device words: the request id and where the oracle's tokens start
(the prompt length; -1 = not known yet, nothing checked). They are set from the engine's req-pool
allocation, wrapped on the instance: sglang's ``ReqToTokenPool.alloc(reqs)`` hands over the requests
(their ``rid`` and ``origin_input_ids``); a pool whose ``alloc`` takes a count (the bundled engine)
gives each new occupant a fresh id, and the row's first decode then fixes the prompt length (a decode's
input is always a sampled token). Like the request-identity notes (request_side.py), the host only notes
them; the device copy runs at the entry of the next forward site, on the forward's stream.

Everything the check does in the forward is torch device work on fixed shapes (no host read), so it is
captured with the forward's CUDA graph and re-reads the graph's static buffers at every replay.
"""

from __future__ import annotations

import hashlib
from typing import Any

from canary_instrument.runtime.passes.hashing import as_signed, mix64_int
from canary_instrument.runtime.setup.instance_wrap import wrap_call
from canary_instrument.runtime.step.plan import DECODE, EXTEND, forward_kind
from canary_instrument.runtime.passes.state import KERNEL_ORACLE, ORACLE

_MARK = "__kv_canary_token_oracle__"
_C1 = as_signed(0xBF58476D1CE4E5B9)
_C2 = as_signed(0x94D049BB133111EB)


def request_id(rid: Any) -> int:
    """Upstream's request id of a request's ``rid`` (``forward_batch_info._stable_hash_str_to_i64``)."""
    digest = hashlib.blake2b(str(rid).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def generalized_request_id(req: Any) -> int:
    """Upstream's id of a request (``select_generalized_req_ids``): its PD-disaggregation bootstrap room
    when it has one (>= 0), so prefill and decode servers agree, else ``request_id(req.rid)``."""
    room = getattr(req, "bootstrap_room", None)
    if isinstance(room, int) and room >= 0:
        return room
    return request_id(req.rid)


def seed_word(seed: int) -> int:
    """``S`` of the hash: 0 for seed 0, so the tokens are upstream's; else ``mix64(seed)`` as signed int64."""
    return 0 if seed == 0 else as_signed(mix64_int(int(seed)))


def oracle_token_int(rid: int, position: int, vocab: int, seed: int = 0) -> int:
    """The oracle's token in plain Python (the reference the tensor version is tested against)."""
    return mix64_int((rid ^ position ^ seed_word(seed)) & 0xFFFFFFFFFFFFFFFF) % vocab


def oracle_tokens(rids: Any, positions: Any, vocab: int, seed_value: int = 0) -> Any:
    """``mix64(rid ^ position ^ seed_value) mod vocab`` elementwise (int64 tensors, uint64 arithmetic)."""
    import torch

    x = rids.to(torch.int64) ^ positions.to(torch.int64)
    if seed_value:
        x = x ^ seed_value
    x = (x ^ _srl(x, 30)) * _C1
    x = (x ^ _srl(x, 27)) * _C2
    x = x ^ _srl(x, 31)
    # uint64 x mod vocab from the signed word: (x mod vocab) + (2^64 mod vocab) for negative words.
    wrap = (1 << 64) % vocab
    return (x % vocab + (x < 0).to(torch.int64) * wrap) % vocab


def _srl(x: Any, shift: int) -> Any:
    return (x >> shift) & ((1 << (64 - shift)) - 1)


class TokenOracle:
    """The oracle of one target model runner: its per-row tables, the sampler override and the input check."""

    def __init__(self, *, rows: int, device: Any, vocab: int, seed: int, check: bool, ring: Any, ring_count: Any,
                 enabled: Any):
        import torch

        if vocab < 1:
            raise ValueError(f"kv canary: the token oracle needs a vocabulary size >= 1; got {vocab}")
        self.vocab = int(vocab)
        self.seed = int(seed)
        self.seed_value = seed_word(seed)
        self.check_inputs = check
        self.device = torch.device(device)
        # Per req-pool row: the request id, and the first position the oracle's tokens fill (-1: unknown).
        self.rid = torch.zeros(int(rows), dtype=torch.int64, device=self.device)
        self.prompt_len = torch.full((int(rows),), -1, dtype=torch.int64, device=self.device)
        self.ring, self.ring_count, self.enabled = ring, ring_count, enabled
        ring_size = int(ring.shape[0])
        # Records of one forward before they enter the ring; row ring_size takes the ones beyond it.
        self._scratch = torch.zeros((ring_size + 1, 8), dtype=torch.int64, device=self.device)
        self._ring_lanes = torch.arange(ring_size, dtype=torch.int64, device=self.device)
        self._notes: dict[int, tuple[int, int]] = {}  # row -> (request id, prompt length) noted since the last apply
        self._next_id = 1
        self.pending = False

    # ------------------------------------------------------------------ host: request notes

    def note_requests(self, rows: Any, reqs: Any) -> None:
        """Rows handed to sglang requests (``ReqToTokenPool.alloc(reqs)``): their ids and prompt lengths."""
        if rows is None:
            return
        for row, req in zip(rows, reqs):
            prompt = getattr(req, "origin_input_ids", None)
            self._notes[int(row)] = (generalized_request_id(req), -1 if prompt is None else len(prompt))
        self.pending = bool(self._notes)

    def note_rows(self, rows: Any) -> None:
        """Rows handed out with no request (a pool whose ``alloc`` takes a count): a fresh id each, prompt unknown."""
        if rows is None:
            return
        values = rows.reshape(-1).tolist() if hasattr(rows, "reshape") else rows
        for row in values:
            self._notes[int(row)] = (request_id(f"kv-canary-row-{self._next_id}"), -1)
            self._next_id += 1
        self.pending = bool(self._notes)

    def apply(self) -> None:
        """Copy the noted rows into the device tables, on the current (the next forward's) stream."""
        import torch

        notes, self._notes = self._notes, {}
        self.pending = False
        if not notes:
            return
        host = torch.tensor([(row, rid, plen) for row, (rid, plen) in notes.items()], dtype=torch.int64)
        if self.device.type == "cuda":
            host = host.pin_memory()
        values = host.to(self.device, non_blocking=True)
        self.rid.index_copy_(0, values[:, 0], values[:, 1])
        self.prompt_len.index_copy_(0, values[:, 0], values[:, 2])

    # ------------------------------------------------------------------ the sampler

    def sample(self, forward_batch: Any, next_token_ids: Any) -> Any:
        """The oracle's tokens in place of ``next_token_ids`` (one per request): position ``seq_lens[i]``
        is the one after request i's last input. A target verify's output is left alone."""
        import torch

        if next_token_ids is None or forward_kind(forward_batch) not in (DECODE, EXTEND):
            return next_token_ids
        n = int(next_token_ids.shape[0])
        rows = forward_batch.req_pool_indices[:n].to(torch.int64)
        tokens = oracle_tokens(self.rid[rows], forward_batch.seq_lens[:n], self.vocab, self.seed_value)
        return tokens.to(next_token_ids.dtype)

    # ------------------------------------------------------------------ the check (inside the forward)

    def check(self, plan: Any, input_ids: Any, forward_batch: Any) -> None:
        """Compare every input id this forward writes past its request's prompt with the oracle's token;
        a mismatch goes into the violation ring (reason ``oracle``). Device work on fixed shapes only."""
        import torch

        if not self.check_inputs or plan is None or input_ids is None:
            return
        kind = forward_kind(forward_batch)
        if kind not in (DECODE, EXTEND):
            return  # a target verify's inputs past the first are draft guesses, not the oracle's tokens
        count = int(input_ids.shape[0])
        positions = getattr(forward_batch, "positions", None)
        if count == 0 or positions is None:
            return
        bs = plan.num_reqs
        lanes = torch.arange(count, dtype=torch.int64, device=input_ids.device)
        if plan.extend_const > 0:
            req = lanes // plan.extend_const
        else:
            ends = torch.cumsum(plan.extend_lens[:bs].to(torch.int64), 0)
            req = torch.searchsorted(ends, lanes, right=True)
        valid = req < bs
        row = plan.req_pool_indices[:bs].to(torch.int64)[req.clamp(max=bs - 1)]
        valid &= row != 0  # graph padding
        row = torch.where(valid, row, 0)
        pos = positions[:count].to(torch.int64)
        on = self.enabled.to(torch.bool)
        plen = self.prompt_len[row]
        if kind == DECODE:
            # A decode's input is a sampled token: a row whose prompt length is unknown learns it here.
            learn = valid & (plen < 0) & on
            plen = torch.where(learn, pos, plen)
            self.prompt_len.index_put_((row,), plen)  # padding lanes write row 0, which no request uses
        expected = oracle_tokens(self.rid[row], pos, self.vocab, self.seed_value)
        got = input_ids[:count].to(torch.int64)
        bad = valid & on & (plen >= 0) & (pos >= plen) & (got != expected)
        loc = getattr(forward_batch, "out_cache_loc", None)
        slot = loc[:count].to(torch.int64) if loc is not None else torch.zeros_like(pos)
        zeros = torch.zeros_like(pos)
        records = torch.stack((zeros + KERNEL_ORACLE, zeros, slot, pos, got, expected, zeros + ORACLE, row), dim=1)
        self._append(bad, records)

    def _append(self, bad: Any, records: Any) -> None:
        """Append the records of ``bad`` lanes to the ring with no host read: the first ring-size of them
        pass through the scratch rows, then every ring lane is rewritten (with itself where nothing came)."""
        import torch

        ring_size = self.ring.shape[0]
        found = bad.to(torch.int64)
        rank = torch.cumsum(found, 0) - 1
        dest = torch.where(bad & (rank < ring_size), rank, ring_size)
        self._scratch.index_copy_(0, dest, records)
        total = found.sum()
        lanes = (self.ring_count.reshape(1) + self._ring_lanes) % ring_size
        take = (self._ring_lanes < total).unsqueeze(1)
        self.ring.index_copy_(0, lanes, torch.where(take, self._scratch[:ring_size], self.ring[lanes]))
        self.ring_count.add_(total)


# ---------------------------------------------------------------------- engine wiring


def install_token_oracle(model_runner: Any, manager: Any, settings: Any, server_args: Any = None) -> TokenOracle:
    """Build the oracle of a target runner, wrap its ``sample`` and its req-pool allocation (on the instance),
    and hand it to ``manager`` (``manager.token_oracle``: the site entry applies its notes, the pre-forward
    pass checks the inputs). Call before the sampled-token wrap, so that one records the oracle's tokens."""
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if algorithm:
        # A target verify keeps the draft's guesses the model accepts, not the oracle's tokens, so a later
        # extend of such a request (a retraction's re-prefill) would be reported against the oracle.
        raise ValueError(
            f"kv canary: the token oracle is not supported with speculative decoding "
            f"(server_args.speculative_algorithm={algorithm!r}): a target verify accepts the draft's tokens, "
            "not the oracle's"
        )
    state = manager.state
    vocab = vocab_size(model_runner)
    oracle = TokenOracle(rows=int(state.req_to_token.shape[0]), device=manager.device, vocab=vocab,
                         seed=settings.token_oracle_seed, check=settings.token_oracle_check,
                         ring=state.ring, ring_count=state.ring_count, enabled=manager.enabled)
    if not _wrap_refusing(model_runner, "sample", lambda args, kwargs, result: oracle.sample(
            args[1] if len(args) > 1 else kwargs.get("forward_batch"), result)):
        raise ValueError(
            f"kv canary: the token oracle needs {type(model_runner).__qualname__}.sample(logits_output, "
            "forward_batch) to override; this runner has none"
        )
    pool = model_runner.req_to_token_pool

    def on_alloc(args: Any, kwargs: Any, result: Any) -> Any:
        reqs = args[0] if args else kwargs.get("reqs")
        if isinstance(reqs, (list, tuple)) and reqs and hasattr(reqs[0], "rid"):
            oracle.note_requests(result, reqs)
        else:
            oracle.note_rows(result)
        return result

    if callable(getattr(pool, "alloc_rows", None)):  # rows handed out with no request start afresh
        _wrap_refusing(pool, "alloc_rows", lambda args, kwargs, result: (oracle.note_rows(result), result)[1])
    if not _wrap_refusing(pool, "alloc", on_alloc):
        raise ValueError(f"kv canary: the token oracle needs {type(pool).__qualname__}.alloc to wrap; it has none")
    manager.token_oracle = oracle
    return oracle


def vocab_size(model_runner: Any) -> int:
    """The runner's vocabulary size: sglang's ``model_config.vocab_size``."""
    size = getattr(getattr(model_runner, "model_config", None), "vocab_size", None)
    if not isinstance(size, int) or size < 1:
        raise ValueError(
            f"kv canary: the token oracle needs {type(model_runner).__qualname__}.model_config.vocab_size; got {size!r}"
        )
    return size


def _wrap_refusing(obj: Any, name: str, after: Any) -> bool:
    """``wrap_call`` for the oracle: a second oracle on the same engine is refused, not stacked."""
    return wrap_call(obj, name, after, _MARK, replace_own=False)
