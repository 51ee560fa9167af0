"""specctl: self-speculative decoding for Llama-family LLMs (batched, lossless)."""

__version__ = "0.1.0"
