"""Triton canary kernels rendered from templates/ by `canary-instrument build-kernels`; do not edit.

manifest.json lists every file with its specialisation axes and content hash.
"""
