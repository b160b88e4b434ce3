"""A small inference runtime that makes a quantised target fast on a CPU: int4/int8 weight-only linears,
the GGUF int4 mapping, fused projections, the lean forward, row-by-row attention, dense prompt forwards,
and the thread policy chosen before torch loads. Knows nothing of pairs, drafting or the CLI."""
