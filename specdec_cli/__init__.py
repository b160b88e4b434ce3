"""specdec: lossless speculative decoding of causal language models."""

__version__ = "0.1.0"
