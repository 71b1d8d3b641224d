"""The ``Perturber``: runs the enabled perturbation kinds at the manager's hook points and logs each injection.

The manager calls, on the target model runner's manager only (token offset 0):

- ``before_forward(view, forward_batch)`` inside the step's outside-graph context, before the model forward;
- ``after_forward(view, forward_batch)`` in the same context, after it (stream order: after the
  post-forward pass);
- ``at_step_end(view)`` after the step's outside-graph context, where the idle-cache sweep runs; there it
  also logs the watched cached slots (``real_kv_unused_cache``) seen leaving the cache unread (``left_cache``).

``view.step`` is the step number the forward's violations carry (at step end: the step just
finished) and ``view.radix_cache`` the prefix cache, or None. Each kind draws from its own
generator seeded from (seed, kind), so enabling one kind does not move another's schedule.
Injections made before a forward are restored after it where that is safe (see the kinds).

With a stop file set (``PerturbSettings.stop_file``), every hook first looks whether the file exists; from the
first hook that finds it, no kind draws or injects again, and the perturber logs once
``kv_canary_perturb_stopped= step=N file=PATH`` (``N`` the hook's step): no injection line after it carries a step
above ``N``. What was injected before stays watched (``left_cache``) and is restored as usual. A harness creates the file when its workload
is done, then serves the reads that must find every injection (serve.py's sweep tail).
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from typing import Any, Optional

from canary_instrument.runtime.perturb.base import KindContext, Planned
from canary_instrument.runtime.perturb.facts import FactReadback
from canary_instrument.runtime.perturb.injection import Injection
from canary_instrument.runtime.perturb.left_cache import CacheWatch, LeftCache
from canary_instrument.runtime.perturb.next_token_swap import NextTokenSwap
from canary_instrument.runtime.perturb.canary_rows import FingerprintZeroed, RowHighBit
from canary_instrument.runtime.perturb.real_kv import RealKvLayer, RealKvPostForward, RealKvUnusedCache, RealKvUsed
from canary_instrument.runtime.perturb.req_to_token import ReqToTokenRemap
from canary_instrument.runtime.perturb.request_faults import PrematureFree, ReqRowSwap, WriteSlot
from canary_instrument.runtime.perturb.perturb_settings import KINDS, PerturbSettings

logger = logging.getLogger("canary_instrument.runtime")

KIND_CLASSES = {cls.name: cls for cls in (ReqToTokenRemap, RealKvUsed, RealKvUnusedCache, RealKvPostForward,
                                          NextTokenSwap, RealKvLayer, FingerprintZeroed, RowHighBit, ReqRowSwap,
                                          WriteSlot, PrematureFree)}
HOOKS = ("before_forward", "after_forward", "step_end")
# Kinds that rewrite req_to_token entries: at most one of them per forward (a row swap would carry a remapped
# entry to the other request, whose report then names neither injection).
_REWRITE_TABLE = frozenset(("req_to_token", "req_row_swap"))
_CORE_FACTS = ("slot", "req", "applied")
_MAX_KEPT = 100_000  # injections kept for drain(); the log has them all
STOPPED = "kv_canary_perturb_stopped="  # the line that says from which step no injection is armed


@dataclass(frozen=True)
class ManagerView:
    """What the hooks read from the manager: the step's number and the attached prefix cache."""

    step: int
    radix_cache: Any = None


def check_usable(settings: PerturbSettings, state: Any) -> None:
    """Raise ValueError naming the setting when an enabled kind cannot be reported on this state."""
    kinds = settings.kinds
    if state.token_offset != 0:
        raise ValueError("kv canary perturbations run on the target model runner's manager (token offset 0), "
                         "not on an EAGLE draft worker's")
    real_kv = [k for k in kinds if k.startswith("real_kv") or k == "fingerprint_zeroed"]
    if real_kv and state.realkv == "none":
        raise ValueError(f"kv canary perturbation {real_kv[0]} needs kv_canary_real_kv=partial or all: with none "
                         "no fingerprint is kept, so a flipped KV bit cannot be reported")
    if "next_token_swap" in kinds and state.sampled_tokens is None:
        raise ValueError("kv canary perturbation next_token_swap needs the token check (kv_canary_token_check on, "
                         "and a model runner with a sample method): without the sampled-token table a swapped token "
                         "cannot be reported")
    if "req_row_swap" in kinds and state.identity is None:
        raise ValueError("kv canary perturbation req_row_swap needs the request-identity table (a target whose "
                         "req_to_token_pool has an alloc the canary wraps): without it a swap cannot be reported")
    if settings.target_group == "swa" and real_kv and state.layout != "swa":
        raise ValueError(f"kv canary perturbation target group 'swa' needs an SWA pool; this pool is {state.layout}")
    if {"req_to_token", "real_kv_used", "real_kv_layer", "fingerprint_zeroed", "row_high_bit", "req_row_swap",
        "premature_free"} & set(kinds):
        if not state.req_to_token.is_contiguous():
            raise ValueError("kv canary perturbations need a contiguous req_to_token table")


class Perturber:
    """``limit`` caps the injections per kind (None: no cap); the fault matrix arms one fault with
    ``rate=1.0, limit=1``: it fires at the first opportunity that has a target, then never again."""

    def __init__(self, settings: PerturbSettings, state: Any, limit: Optional[int] = None):
        check_usable(settings, state)
        if limit is not None and limit < 1:
            raise ValueError(f"kv canary perturb: limit must be >= 1 or None; got {limit}")
        self.settings = settings
        self.state = state
        self.limit = limit
        self._hooks: dict[str, list] = {hook: [] for hook in HOOKS}
        for index, kind in enumerate(KINDS):
            rate = settings.rate(kind)
            if rate > 0:
                impl = KIND_CLASSES[kind]()
                ctx = KindContext(state, random.Random(settings.seed * len(KINDS) + index), settings.target_group)
                self._hooks[impl.hook].append((impl, rate, ctx))
        self._facts = FactReadback(state.req_to_token.device)
        self._undo: list = []
        self._drained: list[Injection] = []
        self._watch = CacheWatch()
        self._left: list[LeftCache] = []
        self.counts = {kind: 0 for kind in settings.kinds}  # injections made (logged or about to be)
        self.stopped_at: Optional[int] = None  # the step whose hook first found the stop file
        logger.warning(
            "kv_canary perturb: enabled %s (seed %d, from step %d, target group %s); each injection is logged "
            "as one kv_canary_perturb line",
            ", ".join(f"{k}={r:g}" for k, r in settings.rates), settings.seed, settings.warmup_steps + 1,
            settings.target_group,
        )

    # ------------------------------------------------------------------ the manager's hook points

    def before_forward(self, view: Any, forward_batch: Any) -> None:
        self._restore()
        self._run("before_forward", view.step, forward_batch=forward_batch)

    def after_forward(self, view: Any, forward_batch: Any) -> None:
        self._restore()  # the forward has read what the before-forward kinds corrupted
        self._run("after_forward", view.step, forward_batch=forward_batch)

    def at_step_end(self, view: Any) -> None:
        self._restore()
        cache = getattr(view, "radix_cache", None)
        for left in self._watch.check(cache, view.step):  # before this step's own injections
            logger.warning("%s", left.format())
            if len(self._left) < _MAX_KEPT:
                self._left.append(left)
        self._run("step_end", view.step, cache=cache)

    def restore(self) -> None:
        """Undo what the before-forward kinds corrupted (the manager calls it when a forward failed)."""
        self._restore()

    def poll(self, wait: bool = False) -> None:
        """Log the injections whose device facts have arrived (``wait``: all of them; the manager's flush)."""
        self._facts.poll(wait=wait)

    def drain(self) -> list[Injection]:
        """Wait for every pending injection's device facts, log them; return the injections logged since the
        last ``drain`` (for tests and soak scoring; the log lines are the product)."""
        self._facts.poll(wait=True)
        out, self._drained = self._drained, []
        return out

    def drain_left(self) -> list[LeftCache]:
        """The ``left_cache`` lines logged since the last ``drain_left`` (for tests and soak scoring)."""
        out, self._left = self._left, []
        return out

    # ------------------------------------------------------------------ internals

    def _stopped(self, step: int) -> bool:
        """Whether the stop file has appeared (looked for until it has: one stat per hook while armed)."""
        if self.stopped_at is None and self.settings.stop_file and os.path.exists(self.settings.stop_file):
            self.stopped_at = step
            logger.warning("%s step=%d file=%s", STOPPED, step, self.settings.stop_file)
        return self.stopped_at is not None

    def _run(self, hook: str, step: int, forward_batch: Any = None, cache: Any = None) -> None:
        if step > self.settings.warmup_steps and not self._stopped(step):
            table_changed = False
            for impl, rate, ctx in self._hooks[hook]:
                if table_changed and impl.name in _REWRITE_TABLE:
                    continue  # one req_to_token rewrite per forward: a second would move the first's report
                if self.limit is not None and self.counts[impl.name] >= self.limit:
                    continue
                if ctx.rng.random() >= rate:
                    continue
                if self._facts.full:  # too many injections await their device facts
                    continue
                planned = impl.inject(ctx, step, forward_batch=forward_batch, cache=cache)
                if planned is not None:
                    self._submit(planned, cache)
                    table_changed = table_changed or impl.name in _REWRITE_TABLE
        self._facts.poll()

    def _restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _submit(self, planned: Planned, cache: Any = None) -> None:
        self.counts[planned.kind] += 1
        if planned.watch is not None and cache is not None:
            self._watch.add(cache, planned.kind, planned.step, planned.position, planned.group, *planned.watch)
        if planned.undo is not None:
            self._undo.append(planned.undo)
        self._facts.submit(planned.device, lambda facts: self._log(planned, facts))

    def _log(self, planned: Planned, facts: dict[str, int]) -> None:
        derived = tuple((name, table[facts.pop(key)]) for name, key, table in planned.derived)
        position = facts.pop("position", planned.position)  # a device fact where the host did not know it
        injection = Injection(
            step=planned.step, kind=planned.kind, group=planned.group, half=planned.half,
            slot=facts.get("slot", planned.slot), position=position, req=facts.get("req", planned.req),
            applied=bool(facts.get("applied", 1)),
            extra=planned.extra + derived + tuple((k, v) for k, v in facts.items() if k not in _CORE_FACTS),
        )
        logger.warning("%s", injection.format())
        if len(self._drained) < _MAX_KEPT:
            self._drained.append(injection)


def make_perturber(settings: PerturbSettings, state: Any) -> Optional[Perturber]:
    """A Perturber when any perturbation is enabled, else None (so the manager's hooks cost one check)."""
    return Perturber(settings, state) if settings.enabled else None
