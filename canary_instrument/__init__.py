"""canary-instrument: KV-cache canaries for LLM serving engines."""

__version__ = "0.1.0"
