"""Host time of the canary's wired sites alone, in a tight loop: no engine, no model, no device work.

A manager on CPU with init finished is entered and left the way the wiring does it, on a forward
batch stub in decode mode: one decode step is the forward site (`outside=[0], active=0`), one EAGLE
step the three sites of a scheduler step (target verify, the draft chain listing 3 sub-forwards, the
draft-extend). No forward runs inside, so no pass ever publishes, and the tagged snapshot (every
16 steps by default, with its health check) is switched off: the loop measures a clean step that
takes none. The figure is the floor of the sites' Python on this machine, warm in its caches;
bench/runtime/step_overhead.py measures them in a running engine.

    PYTHONPATH=. python bench/runtime/site_loop.py
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from kernels.scenario import make_scenario  # noqa: E402
from runtime.mini_engine import ForwardMode  # noqa: E402

from canary_instrument.runtime.manager import CanaryManager  # noqa: E402
from canary_instrument.runtime.passes.ops import get_ops  # noqa: E402
from canary_instrument.runtime.setup.settings import CanarySettings  # noqa: E402
from canary_instrument.runtime.setup.wiring import canary_context  # noqa: E402


def main() -> None:
    scenario = make_scenario("mha", "none", seed=1)
    manager = CanaryManager(settings=CanarySettings(mode="log", readback_interval=1 << 40), state=scenario.state,
                            ops=get_ops("cpu"),
                            device="cpu", num_single_forward=3)
    manager.mark_init_finished()
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=8)  # what the sites read of a batch

    def decode():
        with canary_context(manager, batch, outside=[0], active=0):
            pass

    def eagle():
        with canary_context(manager, batch, outside=[0], active=0):
            pass
        with canary_context(manager, batch, outside=list(range(3))):
            pass
        with canary_context(manager, batch, outside=[0], active=0):
            pass

    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}:")
    for step in (decode, eagle):
        for _ in range(2000):
            step()
        n = 20000
        start = time.perf_counter()
        for _ in range(n):
            step()
        print(f"{step.__name__}: {(time.perf_counter() - start) / n * 1e6:.2f} us per step")


if __name__ == "__main__":
    main()
