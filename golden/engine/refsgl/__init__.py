"""refsgl: a small, runnable, sglang-shaped serving engine used as the reference target of canary-instrument."""
