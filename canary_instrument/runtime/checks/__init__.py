"""Host-side checks: the health check, the verdict across ranks, and the request-identity and freed-slot notes
from the engine's allocators.
"""
