"""The speculative loop and its parts: drafters, acceptance math, KV cache handling, block costs,
adaptive K and a pair made ready to run. Knows nothing of the CLI or the terminal; yields events."""
