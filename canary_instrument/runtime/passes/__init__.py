"""The canary passes on the device: the buffers they read and write (``state``, ``status``, ``layers``), the hash
primitives, and their two backends (``triton_ops``; ``reference``, the torch twin), chosen in ``ops``.
"""
