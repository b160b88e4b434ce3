"""specdec's plain decoding against llama.cpp's server on the same GGUF: decode speed, and how far
the greedy texts agree.

Run it on a quiet machine (../shared/tools/quiet-check): the two sides are timed in turn.

Every prompt goes to both as the same token ids (specdec's tokenizer of the file, sent raw). Each
round is fresh processes, interleaved: a `specdec generate -k 0 --json` over all prompts per dtype,
then a llama-server started on the GGUF and asked for the same ids with the same token budget. Decode speed is tokens after the first over
the time after the first on specdec's side (stats' wall_s − ttft_s) and llama.cpp's own
``timings.predicted_per_second``; the ratio per prompt is specdec's over llama.cpp's, the median
reported. Agreement is the share of the first N tokens before each text leaves llama.cpp's.

Usage: python3 benchmarks/against_llama_server.py GGUF PROMPTS.jsonl OUT.json
           [--count 20: spread evenly over the file] [--tokens 64] [--rounds 2] [--dtypes int4,float32] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from specdec_cli.serving.llama_server import LlamaConfig
from specdec_cli.serving.server import ManagedServer


def specdec_run(gguf: str, prompts: list[str], dtype: str, tokens: int, threads: int) -> list[dict]:
    """One fresh `specdec generate -k 0` over every prompt: per prompt its ids, answer ids and decode tok/s."""
    with tempfile.NamedTemporaryFile("w+", suffix=".jsonl") as file:
        file.write("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        file.flush()
        file.seek(0)
        done = subprocess.run(["specdec", "generate", "--target", gguf, "--draft", "ngram", "--dtype", dtype, "-k", "0",
                               "--raw", "--json", "--batch", "1", "--max-new-tokens", str(tokens), "--threads", str(threads)],
                              stdin=file, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"specdec generate failed ({dtype}): {done.stderr.strip()[-500:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return [{"answer": r["token_ids"], "decode_tok_s": decode_speed(r["stats"])} for r in rows]


def decode_speed(stats: dict) -> float | None:
    """Tokens after the first over the time after the first; None for an answer of one token."""
    after = stats["wall_s"] - stats["ttft_s"]
    return (stats["new_tokens"] - 1) / after if stats["new_tokens"] > 1 and after > 0 else None


def llama_run(gguf: str, prompt_ids: list[list[int]], tokens: int, threads: int) -> list[dict]:
    """A fresh llama-server on ``gguf``, greedy, no prompt cache: per prompt its answer ids and decode tok/s."""
    config = LlamaConfig("llama-plain", Path(gguf).resolve(), "target", threads=threads)
    found = []
    with ManagedServer(config) as server:
        for ids in prompt_ids:
            body = {"prompt": ids, "n_predict": tokens, "temperature": 0.0, "return_tokens": True, "cache_prompt": False}
            request = urllib.request.Request(server.endpoint.url + "/completion", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            answer = json.loads(urllib.request.urlopen(request, timeout=600).read())
            found.append({"answer": answer["tokens"], "decode_tok_s": answer["timings"]["predicted_per_second"]})
    return found


def prompt_ids(gguf: str, prompts: list[str]) -> list[list[int]]:
    """The prompts as specdec sends them raw: its tokenizer of the file's conversion."""
    from specdec_cli.pairs.conversion import converted
    from specdec_cli.pairs.loading import target_tokenizer
    from specdec_cli.pairs.sources import ModelSource
    from specdec_cli.pairs.tokenization import encode_prompt

    source = ModelSource.parse(gguf)
    path = source.local_path()
    tokenizer = target_tokenizer(converted(source, str(path.parent), path.name, weights=False), lean=True,
                                 without_transformers=False)
    return [encode_prompt(tokenizer, prompt, raw=True) for prompt in prompts]


def agreement(ours: list[int], theirs: list[int]) -> float:
    """The share of ``theirs`` that ``ours`` matches before the first difference."""
    same = 0
    for a, b in zip(ours, theirs):
        if a != b:
            break
        same += 1
    return same / max(len(theirs), 1)


def summarise(rounds: list[dict], dtypes: list[str]) -> dict:
    """Per dtype the median decode ratio and speed, and the agreement of round 1's answers with llama.cpp's."""
    summary = {}
    for dtype in dtypes:
        ratios = [o["decode_tok_s"] / t["decode_tok_s"] for r in rounds for o, t in zip(r["specdec"][dtype], r["llama.cpp"])
                  if o["decode_tok_s"] and t["decode_tok_s"]]  # both wrote more than one token
        agree = [agreement(o["answer"], t["answer"]) for o, t in zip(rounds[0]["specdec"][dtype], rounds[0]["llama.cpp"])]
        speeds = [o["decode_tok_s"] for r in rounds for o in r["specdec"][dtype] if o["decode_tok_s"]]
        summary[dtype] = {"decode_vs_llama_median": round(statistics.median(ratios), 3),
                          "decode_tok_s_median": round(statistics.median(speeds), 1),
                          "tokens_equal_to_llama": round(statistics.mean(agree), 3),
                          "answers_equal_to_llama": sum(a == 1.0 for a in agree), "prompts": len(agree)}
    summary["llama.cpp"] = {"decode_tok_s_median": round(statistics.median(
        t["decode_tok_s"] for r in rounds for t in r["llama.cpp"] if t["decode_tok_s"]), 1)}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf")
    parser.add_argument("prompts")
    parser.add_argument("out")
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", default="int4,float32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    every = [json.loads(line)["prompt"] for line in open(args.prompts)]
    prompts = every[:: max(1, len(every) // args.count)][: args.count]  # spread over the file's scenarios
    dtypes = args.dtypes.split(",")
    ids = prompt_ids(args.gguf, prompts)
    rounds = []
    for _ in range(args.rounds):
        ours = {dtype: specdec_run(args.gguf, prompts, dtype, args.tokens, args.threads) for dtype in dtypes}
        theirs = llama_run(args.gguf, ids, args.tokens, args.threads)
        rounds.append({"specdec": ours, "llama.cpp": theirs})
    summary = summarise(rounds, dtypes)
    Path(args.out).write_text(json.dumps({"gguf": args.gguf, "tokens": args.tokens, "threads": args.threads,
                                          "summary": summary, "rounds": rounds}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
