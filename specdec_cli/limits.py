"""Numbers the command line needs before any model is loaded (option help, argument checks).

They live here, away from torch and transformers, so that `specdec --help`, `specdec models` and
argument errors answer at once; engine.py, equivalence.py and sampling_check.py import them from here.
"""

MAX_K = 32  # beyond this, a single verify forward costs more than any acceptance rate can repay
MAX_BATCH = 64  # prompts decoded at once: past it a step's forward is compute-bound many times over

# How far apart two logits may be and still be ordered either way by round-off, by the target's
# dtype name (equivalence.TOLERANCE keys them by torch dtype). Forwards of different shape differ by
# ~1e-5 in float32; bf16/fp16 round the logits themselves to ~2^-8 / 2^-11 relative (±0.06-0.125 at
# |logit| ≈ 20), and a flip can cost a few such steps.
NEAR_TIE_TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "float16": 0.05, "bfloat16": 0.5}

SEEDS = 2**64  # seeds are 0 .. SEEDS - 1: the race's noise keys Philox with 64 bits of one (coupling.py), as torch's generators do

SAMPLING_PROMPTS = 3  # verify-equivalence --sampling: how many of the prompts are sampled
SAMPLING_TOKENS = 3  # tokens per sampled continuation: enough for a draft block to be accepted inside it

# The suffix memory's bound in answer tokens (leads included): 2.1 kB a token where every n-gram is new
# (tracemalloc, 8 levels of tuple keys and count dicts), so at most ~42 MiB; about 300 answers of 64
# tokens. Here, not in decoding/drafters/suffix.py, because `generate --memory` checks its file before torch loads.
MEMORY_TOKENS = 20_000
