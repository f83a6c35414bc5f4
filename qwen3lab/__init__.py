"""qwen3lab: measure vLLM launch configurations."""
__version__ = "0.1.0"
