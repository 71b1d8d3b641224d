"""CI107 unknown-hand-wiring.

Reports: hand-written canary wiring that no catalog role covers (e.g. a `canary_run_ctx` passed to a new kind of
warm-up run); the message holds the `[tool.canary-instrument]` entry that would cover it, ready to paste into
`pyproject.toml`

Why: Canary code no role covers is neither checked nor migrated: the catalog must learn its site first.

Fix: add the entry (review its `calls`, `manager`, `wiring`)
"""

from canary_instrument.rewrite.findings import UNKNOWN_HAND_WIRING as CODE  # noqa: F401 (the row's code)

PROBLEMS = "unknown"
MESSAGE = (
    "`{problem.name}` holds hand-written canary wiring that no catalog role covers; to let the tool manage it, "
    "add under [tool.canary-instrument]: {problem.detail}"
)
LEFT_ALONE = (
    "`{problem.name}` holds hand-written canary wiring no catalog role covers; left alone (add under "
    "[tool.canary-instrument]: {problem.detail})"
)
