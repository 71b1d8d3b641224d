"""Setting the canary up and what generated wiring calls: ``install_canary``, the settings, canary rows on the KV
pool, the wired sites and their contexts, and the wrappers installed on engine instances. Imports no torch.
"""
