"""Is a head's low acceptance on a prompt file the text's entropy or the head's reach? Teacher-forced
first-position agreement with the target, bucketed by how sure the target is of its token, on the
target's greedy answers to a prompt file and on the target's own text from the teacher pass.

    python benchmarks/head_agreement.py --prompts benchmarks/unseen-prompts.jsonl \\
        --own 'runs/teacher/conversations-shard-*.pt' [--draft DIR]

Every position of an answer is scored as a first draft position would be (the target's features
before it, its token), not only the positions a round starts at, so more positions count than in
benchmarks/drafter_report.py. ``copy`` marks a token that closes a bigram seen earlier in the
sequence. ``--own`` should name text the head never trained on (the shipped head never saw the
conversations); the greedy answers (or copy tasks) there are used, up to ``--limit``. ``--corpus``
also pits an n-gram model of answer shards (the head's own training text) against the head, position
by position: where it is sure, does it know what the head does not?
"""

from __future__ import annotations

import argparse
import glob
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

import torch
from drafter_report import closes_earlier_bigram  # benchmarks/, this script's directory

from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.drafters.head import load_head
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.pairs.registry import load_registry, override
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file
from specdec_cli.training.corpus import read_shard
from specdec_cli.training.distill import Example, collate, teacher
from specdec_cli.training.loop import HeadStudent

BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)  # the target's top-1 probability
CORPUS_N = 4


def corpus_table(pattern: str, n: int = CORPUS_N) -> list[dict]:
    """Next-token counts after every 1..n tokens in the answers of the shards matching ``pattern``
    (comma-separated globs)."""
    table = [defaultdict(Counter) for _ in range(n + 1)]
    for path in sorted(path for part in pattern.split(",") for path in glob.glob(part)):
        for row in read_shard(Path(path)):
            ids = row["ids"]
            for t in range(row["start"], len(ids)):
                for m in range(1, min(n, t) + 1):
                    table[m][tuple(ids[t - m : t])][ids[t]] += 1
    return table


def corpus_guess(table: list[dict], before: list[int]) -> tuple[int, bool] | None:
    """The corpus's most frequent next token after the longest seen suffix of ``before``, and whether it
    is sure: a 3- or 4-token match whose top token took at least half of 3 or more occurrences."""
    for m in range(len(table) - 1, 0, -1):
        counts = table[m].get(tuple(before[-m:])) if len(before) >= m else None
        if counts:
            token, top = counts.most_common(1)[0]
            total = sum(counts.values())
            return token, m >= 3 and total >= 3 and top >= total / 2
    return None


class Guesses(NamedTuple):
    """One batch's answer positions (example ``at + row``, position), the target's top-1 token and
    probability there, and the head's guess and confidence: what the scores read, not the features."""

    at: int
    where: list[tuple[int, int]]
    truth: torch.Tensor
    truth_p: torch.Tensor
    choice: torch.Tensor
    sure: torch.Tensor


def head_guesses(student: HeadStudent, allowed: torch.Tensor | None, examples: list[Example], pad: int) -> list[Guesses]:
    """The head's first-position guess at every answer position: one forward over the examples, read
    by every score below."""
    guesses = []
    for at in range(0, len(examples), 8):
        batch = collate(examples[at : at + 8], pad)
        with torch.no_grad():
            logits = student.logits(batch, 1)[0][0]
        choice = logits.argmax(-1) if allowed is None else allowed[logits.argmax(-1)]
        guesses.append(Guesses(at, list(zip(*(w.tolist() for w in batch.where))), batch.top_ids[:, 0],
                               batch.top_logp[:, 0].float().exp(), choice, torch.softmax(logits.float(), -1).max(-1).values))
    return guesses


def against_corpus(examples: list[Example], guesses: list[Guesses], table: list[dict]) -> dict:
    """Does an n-gram model of the head's own training answers know what the head does not? Head and
    corpus guesses at every first draft position, where the corpus has a guess, and a fusion that
    takes the corpus's guess where it is sure and the head's confidence is below 0.5."""
    count, n = Counter(), len(table) - 1
    for g in guesses:
        for i, (r, p) in enumerate(g.where):
            truth, head = int(g.truth[i]), int(g.choice[i])
            guess = corpus_guess(table, examples[g.at + r].ids[max(0, p + 1 - n) : p + 1].tolist())
            count["positions"] += 1
            count["head"] += head == truth
            fused = head
            if guess is not None:
                token, sure = guess
                kind = "sure" if sure else "unsure"
                count[kind] += 1
                count[f"{kind}_head"] += head == truth
                count[f"{kind}_corpus"] += token == truth
                count["either"] += truth in (token, head)
                if sure and float(g.sure[i]) < 0.5:
                    fused = token
            else:
                count["either"] += head == truth
            count["fused"] += fused == truth
    share = lambda a, b: round(count[a] / max(1, count[b]), 3)  # noqa: E731
    return {"positions": count["positions"], "head": share("head", "positions"), "fused": share("fused", "positions"),
            "either": share("either", "positions"),
            **{kind: {"share": share(kind, "positions"), "head": share(f"{kind}_head", kind), "corpus": share(f"{kind}_corpus", kind)}
               for kind in ("sure", "unsure")}}


def agreement(examples: list[Example], guesses: list[Guesses]) -> dict:
    hits, counts = torch.zeros(len(BUCKETS) - 1, 2), torch.zeros(len(BUCKETS) - 1, 2)  # columns: fresh, copy
    for g in guesses:
        hit = g.choice == g.truth
        bucket = torch.bucketize(g.truth_p, torch.tensor(BUCKETS[1:-1]), right=True)
        flags = [closes_earlier_bigram(e.ids.tolist()) for e in examples[g.at : g.at + 8]]
        copy = torch.tensor([flags[r][p + 1] for r, p in g.where], dtype=torch.long)
        hits.index_put_((bucket, copy), hit.float(), accumulate=True)
        counts.index_put_((bucket, copy), torch.ones_like(hit, dtype=torch.float), accumulate=True)
    share = counts.sum(1) / counts.sum()
    return {
        "positions": int(counts.sum()),
        "agreement": round(float(hits.sum() / counts.sum()), 3),
        "by_target_top1": {f"{lo}-{hi}": {"share": round(float(share[i]), 3), "agreement": round(float(hits[i].sum() / counts[i].sum().clamp(min=1)), 3)}
                           for i, (lo, hi) in enumerate(zip(BUCKETS, BUCKETS[1:]))},
        "copy": round(float(hits[:, 1].sum() / counts[:, 1].sum().clamp(min=1)), 3),
        "fresh": round(float(hits[:, 0].sum() / counts[:, 0].sum().clamp(min=1)), 3),
        "copy_share": round(float(counts[:, 1].sum() / counts.sum()), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--own", required=True, help="teacher-pass files (glob) of text the head never trained on")
    parser.add_argument("--draft", default=None, help="a head directory (default: the pair's)")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--corpus", default=None, help="answer shards (comma-separated globs, e.g. 'examples/answers/answers/*.gz'): "
                        "also score an n-gram model of them against the head on the prompts' answers")
    args = parser.parse_args()

    pair = override(load_registry(None).pair(None), draft=args.draft)
    runtime = load_pair(pair)
    target = runtime.target.model
    drafter = load_head(pair.alternate("head").head, target, runtime.target.source)
    student = HeadStudent(drafter.head.eval(), target, drafter.allowed, unroll=1)
    pad = runtime.tokenizer.pad_token_id or 0
    layers = drafter.head.feature_layers

    own = []
    for path in sorted(glob.glob(args.own)):
        data = torch.load(path, weights_only=True)
        columns = [list(data["layers"]).index(i) for i in layers]
        width = data["examples"][0]["hidden"].shape[1] // len(data["layers"])
        for e in data["examples"]:
            if e["kind"] != "sampled" and len(own) < args.limit:
                hidden = torch.cat([e["hidden"][:, c * width : (c + 1) * width] for c in columns], -1).float()
                own.append(Example(e["ids"].long(), e["start"], e["top_ids"], e["top_logp"].float(), hidden))
    if not own:
        raise SystemExit(f"no greedy answers or copy tasks in {args.own}")

    engine = SpeculativeEngine(target, drafter, runtime.eos_token_ids, runtime.block_plan)  # k=0: plain decoding
    sequences = []
    for prompt in read_file(args.prompts):
        ids = encode_prompt(runtime.tokenizer, prompt.text)
        answer = [t for event in engine.generate(ids, k=0, max_new_tokens=args.max_new_tokens) for t in event.emitted]
        sequences.append((ids + answer, len(ids)))
    answers = teacher(target, sequences, 32, True, 4, pad, layers=layers)
    guesses = head_guesses(student, drafter.allowed, answers, pad)
    report = {"draft": args.draft or "the pair's head",
              "own": {"files": args.own, **agreement(own, head_guesses(student, drafter.allowed, own, pad))},
              "prompts": {"file": args.prompts, **agreement(answers, guesses)}}
    if args.corpus:
        report["corpus"] = {"shards": args.corpus, **against_corpus(answers, guesses, corpus_table(args.corpus))}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
