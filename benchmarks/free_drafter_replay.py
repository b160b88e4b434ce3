"""What the free drafters could give, replayed on the default target's plain answers: each drafter's
chain, the best of them each round (an oracle), and one tree merging them all, against the verify
cost of what each round sends the target.

    python benchmarks/free_drafter_replay.py --prompts benchmarks/unseen-prompts.jsonl --json

Greedy plain decoding gives each prompt's answer, in file order, as one process sees them. Rounds are
walked as a run walks them: at each position every free drafter proposes up to --depth tokens from
the context so far (prompt lookup on any match; token recycling from a table fed with every position
the target confirmed, which is less than a run feeds it, the rejected drafts' rows being unknown
here; the suffix memory of the earlier answers); a policy picks what is verified, the target keeps
the longest prefix equal to its answer plus one token of its own, and the next round starts there.
A round's cost is the block-cost cache's verify cost of its node count over one token, drafting
taken as free. Untimed: the speeds are predictions from those costs.

With --signals, it also says how often each drafter's first token is the target's next one, split
by what is known when a round starts: the lookup's match length, whether two drafters agree on the
first token, and the target's probability of the token it just emitted (from the plain run's rows).
If one of these separated the rounds that keep a draft from those that do not, a schedule could
skip drafting on the others: the oracle's gain is mostly in knowing when not to draft.

Policies: each drafter alone (its chain whenever it has one, else plain); ``first``: lookup on a
match of two or more, else the memory, else recycling; ``agreed``: lookup on a match of two or more,
else a chain whose first token two drafters propose, else no draft; ``oracle``: the chain that keeps the most;
``tree``: every chain merged into one tree (shared prefixes once), which keeps what the best of them
keeps; ``tree<=N``: the same tree cut to its first N nodes in breadth-first order.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from specdec_cli.decoding.blocks import relative_costs
from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.decoding.drafters.recycle import RecycleDrafter
from specdec_cli.decoding.drafters.suffix import SuffixDrafter
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file

DRAFTERS = ("lookup", "suffix", "recycle")


def kept(chain: list[int], truth: list[int]) -> int:
    """How many of a chain's tokens equal the answer's next ones, from the first."""
    n = 0
    for a, b in zip(chain, truth):
        if a != b:
            break
        n += 1
    return n


def trie_nodes(chains: list[list[int]], limit: int | None = None) -> tuple[int, list[list[int]]]:
    """Nodes of the tree merging ``chains`` (shared prefixes once), and the chains cut to the tree's
    first ``limit`` nodes in breadth-first order."""
    nodes: dict[tuple[int, ...], int] = {}
    for depth in range(max((len(c) for c in chains), default=0)):
        for chain in chains:
            if depth < len(chain):
                nodes.setdefault(tuple(chain[: depth + 1]), len(nodes))
    allowed = {path for path, order in nodes.items() if limit is None or order < limit}
    cut = []
    for chain in chains:
        n = 0
        while n < len(chain) and tuple(chain[: n + 1]) in allowed:
            n += 1
        cut.append(chain[:n])
    return len(allowed), cut


def agreeing(chains: dict[str, list[int]]) -> list[str]:
    """The drafters, in DRAFTERS' order, whose first token another drafter also proposes."""
    firsts = [chains[name][0] for name in DRAFTERS if chains[name]]
    return [name for name in DRAFTERS if chains[name] and firsts.count(chains[name][0]) > 1]


def agreed_chain(chains: dict[str, list[int]]) -> list[int]:
    """Lookup on a match of two or more; else the first chain (lookup, memory, recycling) whose first
    token another drafter also proposes; else no draft."""
    if chains["lookup_match"] >= 2:
        return chains["lookup"]
    return next((chains[name] for name in agreeing(chains)), [])


def policies(chains: dict[str, list[int]], truth: list[int], tree_limits: tuple[int, ...]) -> dict[str, tuple[int, int]]:
    """(nodes verified, drafts kept) of this round under each policy."""
    got = {name: (len(chains[name]), kept(chains[name], truth)) for name in DRAFTERS}
    lookup_long = chains["lookup"] if chains["lookup_match"] >= 2 else []
    first = next((c for c in (lookup_long, chains["suffix"], chains["recycle"]) if c), [])
    got["first"] = (len(first), kept(first, truth))
    got["agreed"] = (len(agreed := agreed_chain(chains)), kept(agreed, truth))
    best = max(DRAFTERS, key=lambda name: (got[name][1], -got[name][0]))
    got["oracle"] = (len(chains[best]), got[best][1]) if got[best][1] else (0, 0)  # nothing kept: plain
    every = [chains[name] for name in DRAFTERS if chains[name]]
    for limit in (None, *tree_limits):
        nodes, cut = trie_nodes(every, limit)
        got["tree" if limit is None else f"tree<={limit}"] = (nodes, max((kept(c, truth) for c in cut), default=0))
    return got


def signal_cells(chains: dict[str, list[int]], confidence: float) -> list[str]:
    """The cells of the signals table this position falls in."""
    match = chains["lookup_match"]
    agreed = bool(agreeing(chains))
    band = "p<0.5" if confidence < 0.5 else "p<0.9" if confidence < 0.9 else "p>=0.9"
    lookup = "lookup>=2" if match >= 2 else "lookup=1" if match == 1 else "no lookup"
    return [lookup, f"{lookup}, {'agreed' if agreed else 'alone'}", band, f"{band}, {'agreed' if agreed else 'alone'}",
            "agreed" if agreed else "alone"]


def first_right(chains: dict[str, list[int]], truth: list[int]) -> dict[str, bool | None]:
    """Per drafter: its first token is the target's next one (None: it had no draft)."""
    return {name: (chains[name][0] == truth[0]) if chains[name] else None for name in DRAFTERS}


def signals_table(rows: list[tuple[list[str], dict[str, bool | None], int]]) -> dict[str, dict]:
    """Per cell: positions, and for each drafter and for ``first``'s chain the share of its drafts
    whose first token the target keeps."""
    table: dict[str, dict] = {}
    for cells, right, first_kept in rows:
        for cell in cells:
            entry = table.setdefault(cell, {"positions": 0, "first": [0, 0], **{n: [0, 0] for n in DRAFTERS}})
            entry["positions"] += 1
            for name, ok in right.items():
                if ok is not None:
                    entry[name][0] += int(ok)
                    entry[name][1] += 1
            if first_kept >= 0:
                entry["first"][0] += int(first_kept > 0)
                entry["first"][1] += 1
    def share(kept_n: list[int]) -> dict:
        return {"drafts": kept_n[1], "first_kept": round(kept_n[0] / kept_n[1], 3) if kept_n[1] else None}
    return {cell: {"positions": e["positions"], **{name: share(e[name]) for name in ("first", *DRAFTERS)}}
            for cell, e in sorted(table.items())}


def block_cost(runtime) -> Callable[[int], float]:
    """A verify block of n nodes in one-token forwards, from the pair's block-cost cache (past the
    longest measured, 0.12 a node more); no draft costs one forward."""
    costs = relative_costs(runtime.block_costs, runtime.block_plan)
    return lambda nodes: 1.0 if nodes == 0 else costs.get(nodes, max(costs.values()) + 0.12 * (nodes - max(costs)))


def walk(answer_at, length: int, choose) -> tuple[int, float]:
    """(rounds, cost) of a run through an answer of ``length`` tokens, each round ``choose(position)``
    giving (nodes, kept) at the position reached."""
    position, rounds, cost = 0, 0, 0.0
    while position < length:
        nodes, accepted = choose(position)
        rounds += 1
        cost += answer_at(nodes)
        position += accepted + 1
    return rounds, cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--depth", type=int, default=4, help="tokens per drafter chain")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--signals", action="store_true", help="first-token acceptance by what a round knows")
    args = parser.parse_args()
    runtime = load_pair(load_registry().pair(None))
    cost = block_cost(runtime)

    plain = SpeculativeEngine(runtime.target.model, None, runtime.eos_token_ids, runtime.block_plan)
    vocab = runtime.target.model.config.get_text_config().vocab_size
    recycle, memory = RecycleDrafter(vocab), SuffixDrafter()
    tree_limits = (4, 6, 8)
    names = (*DRAFTERS, "first", "agreed", "oracle", "tree", *(f"tree<={n}" for n in tree_limits))
    totals = {name: [0, 0.0] for name in names}
    tokens_total = 0
    signal_rows: list[tuple[list[str], dict[str, bool | None], int]] = []
    for prompt in [p for path in args.prompts for p in read_file(path)]:
        ids = encode_prompt(runtime.tokenizer, prompt.text)
        events = list(plain.generate(ids, k=0, max_new_tokens=args.max_new_tokens, record_logits=args.signals))
        answer = [t for e in events for t in e.emitted]
        emitted_p = [float(torch.softmax(e.logits[0].float(), -1).max()) if args.signals else 1.0 for e in events]
        context = torch.tensor(ids + answer)
        lookup = NgramDrafter(max_ngram=3, min_ngram=1)
        rounds_at = []
        for step in range(len(ids), len(context)):
            here = context[:step]
            draft = lookup.propose(here, args.depth, None, None)
            match = 3 if draft.source == "lookup" else int(draft.source[-1]) if draft.source else 0
            chains = {"lookup": draft.tokens.tolist(), "lookup_match": match,
                      "suffix": memory.propose(here, args.depth, None, None).tokens.tolist(),
                      "recycle": recycle.propose(here, args.depth, None, None).tokens.tolist()}
            truth = context[step:].tolist()
            rounds_at.append(policies(chains, truth, tree_limits))
            if args.signals and step > len(ids):
                first = rounds_at[-1]["first"]
                signal_rows.append((signal_cells(chains, emitted_p[step - len(ids) - 1]),
                                    first_right(chains, truth), first[1] if first[0] else -1))
            recycle.table[int(context[step - 1]), 0] = int(context[step])  # the target's choice after it
        for name in names:
            rounds, spent = walk(cost, len(answer), lambda position: rounds_at[position][name])
            totals[name][0] += rounds
            totals[name][1] += spent
        tokens_total += len(answer)
        start = max(len(ids) - 8, 0)
        memory.remember(context[start:].tolist(), len(ids) - start)
    report = {"prompts": args.prompts, "depth": args.depth, "tokens": tokens_total, "policies": {
        name: {"tokens_per_round": round(tokens_total / rounds, 3), "predicted_speedup": round(tokens_total / spent, 3)}
        for name, (rounds, spent) in totals.items()}}
    if args.signals:
        report["signals"] = signals_table(signal_rows)
    print(json.dumps(report, indent=1) if args.json else report)


if __name__ == "__main__":
    main()
