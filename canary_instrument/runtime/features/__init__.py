"""Optional features, each idle unless its setting or the engine asks for it: the idle-cache sweep and its
backends, canary rows through HiCache's host tier, timing jitter, and the token oracle.
"""
