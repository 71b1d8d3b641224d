"""From the device's status and ring to the user: status snapshots and their readback, violations, the stats line,
the SWA divergence line, and the parseable log-line format they share.
"""
