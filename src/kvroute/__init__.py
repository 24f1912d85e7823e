"""kvroute: what KV-cache compression does to an LLM's attention routing."""

__version__ = "0.1.0"
