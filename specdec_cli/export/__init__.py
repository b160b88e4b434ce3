"""Calibrate here, deploy there: specdec's K, per-batch-size table and draft head in the form the
serving engines load (vLLM, SGLang, llama.cpp's server, transformers' GenerationConfig)."""
