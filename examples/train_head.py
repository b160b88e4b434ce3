"""Trains the shipped draft head from examples/answers/ (docs/training.md has the runs).

    python examples/train_head.py teacher --minutes 9            # features + top-k, per answer shard
    python examples/train_head.py train --out runs/head --minutes 9 [--resume] [options]

The teacher pass re-reads the target's stored answers (token ids) and keeps, per position, its
top-k log-probabilities and the hidden states a head may read (``LAYERS``): it never asks the
target to write again. Both stages are resumable, so each run fits a time budget: the teacher pass
skips shards it has done; ``train --resume`` continues the optimiser, the data order and the best
held-out state. Prompts are held out by id (all answers of a held-out prompt), seeded.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import random
import time
from collections import Counter
from pathlib import Path

import torch

from specdec_cli.decoding.head_files import save_head, target_identity
from specdec_cli.decoding.head_network import DraftHead, head_config
from specdec_cli.pairs.meta import read_meta
from specdec_cli.runtime.quantize import dense_kernels
from specdec_cli.prompts import read_file
from specdec_cli.training.corpus import read_shard, within_budget
from specdec_cli.training.distill import Example, default_target, teacher
from specdec_cli.training.loop import Budget, HeadStudent, Trainer, save_atomically

HERE = Path(__file__).resolve().parent
ANSWERS = HERE / "answers"
TEACHER = HERE.parent / "runs" / "teacher"
SHIPPED = HERE.parent / "specdec_cli" / "trained" / "smollm2-135m-head"
LAYERS = (2, 15, -1)  # low, middle, high (the last, post-norm: what the format-1 head reads)
TOP_K = 32


def answer_shards() -> list[Path]:
    return sorted(ANSWERS.glob("*/shard-*.jsonl.gz"))


def stage_teacher(minutes: float, batch_size: int, shards: str = "*") -> None:
    """``shards``: a glob over ``<stage>/shard-N.jsonl.gz`` to score only those (a budget's worth)."""
    todo = [p for p in answer_shards() if not (TEACHER / f"{p.parent.name}-{p.name}.pt").is_file()
            and fnmatch.fnmatch(f"{p.parent.name}/{p.name}", shards)]
    print(f"{len(todo)} shards to score", flush=True)
    if not todo:
        return
    target, _, pad = default_target()
    identity = target_identity(target.model, target.source)
    with dense_kernels(target.model):  # de-quantised once for every shard, not once a shard
        for path in within_budget(todo, minutes):
            began = time.monotonic()
            rows = read_shard(path)
            rows.sort(key=lambda r: len(r["ids"]))  # less padding per batch
            examples = teacher(target.model, [(r["ids"], r["start"]) for r in rows], TOP_K, True, batch_size, pad,
                               layers=LAYERS)
            kept = [{"id": r["id"], "kind": r["kind"], "ids": e.ids, "start": e.start, "top_ids": e.top_ids,
                     "top_logp": e.top_logp.half(), "hidden": e.hidden.bfloat16()} for r, e in zip(rows, examples)]
            TEACHER.mkdir(parents=True, exist_ok=True)
            save_atomically({"layers": LAYERS, "top_k": TOP_K, "target": identity, "examples": kept},
                            TEACHER / f"{path.parent.name}-{path.name}.pt")
            print(f"{path.parent.name}/{path.name}: {len(kept)} sequences, {time.monotonic() - began:.0f} s", flush=True)


def load_examples(seed: int, holdout: float) -> tuple[list[Example], list[tuple[Example, str, str]], dict]:
    """Training examples, and the held-out ones with the teacher file and prompt id each came from."""
    files = sorted(TEACHER.glob("*.pt"))
    if not files:
        raise SystemExit("no teacher data: run the teacher stage first")
    rows, info = [], {}
    for path in files:
        data = torch.load(path, weights_only=True)
        info = {k: data[k] for k in ("layers", "top_k", "target")}
        rows += [{**r, "shard": path.name} for r in data["examples"]]
    ids = sorted({r["id"] for r in rows})
    random.Random(seed).shuffle(ids)
    held = set(ids[: round(holdout * len(ids))])
    train, heldout = [], []
    for r in rows:
        example = Example(r["ids"], r["start"], r["top_ids"], r["top_logp"].float(), r["hidden"], r["id"] in held)
        if example.heldout:
            heldout.append((example, r["shard"], r["id"]))
        else:
            train.append(example)
    info["sequences"], info["answer_tokens"] = len(rows), sum(len(r["ids"]) - r["start"] for r in rows)
    return train, heldout, info


def evaluation_set(heldout, shards: str, prefix: str, size: int, seed: int) -> list[Example]:
    """A seeded sample of the held-out examples from teacher files matching ``shards`` whose prompt ids
    start with ``prefix``: where a warm start already trained on some shards (a held-out split by id
    over more data puts some of its training prompts in the held-out set), the agreement is measured
    only on text it never saw."""
    chosen = [e for e, shard, id_ in heldout if fnmatch.fnmatch(shard, shards) and id_.startswith(prefix)]
    random.Random(seed).shuffle(chosen)
    if not chosen:
        raise SystemExit(f"no held-out examples from {shards!r} with ids starting {prefix!r}")
    return chosen[:size]


def vocabulary(train: list[Example], coverage: float, eos: set[int], multiple: int = 256) -> tuple[list[int], float]:
    """The fewest most-frequent answer ids (EOS always in) covering ``coverage`` of the training answers'
    tokens, rounded up to ``multiple``; and the share they cover."""
    counts = Counter()
    for e in train:
        counts.update(e.ids[e.start :].tolist())
    total = sum(counts.values())
    order = [t for t, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    covered, size = 0, 0
    for size, token in enumerate(order, start=1):
        covered += counts[token]
        if covered >= coverage * total:
            break
    size = min(len(order), -(-size // multiple) * multiple)
    chosen = sorted(set(order[:size]) | set(eos))
    return chosen, round(sum(counts[t] for t in chosen) / total, 4)


def stage_train(args) -> None:
    torch.manual_seed(args.seed)
    target, eos, pad = default_target()
    train, heldout, info = load_examples(args.seed, 0.1)
    identity = target_identity(target.model, target.source)
    if info["target"]["fingerprint"] != identity["fingerprint"]:
        raise SystemExit("the teacher data were made with another target")
    layers = tuple(int(x) for x in args.feature_layers.split(","))
    hidden = target.model.config.get_text_config().hidden_size
    columns = torch.cat([torch.arange(info["layers"].index(i) * hidden, (info["layers"].index(i) + 1) * hidden) for i in layers])
    if args.vocab_from or args.vocab_size:
        counts = Counter(t for e in train for t in e.ids[e.start :].tolist())
        chosen = (read_meta(Path(args.vocab_from))["top_vocab"] if args.vocab_from
                  else [t for t, _ in counts.most_common(args.vocab_size)])
        allowed = sorted(set(chosen) | set(eos))
        covered = round(sum(counts[t] for t in allowed) / sum(counts.values()), 4)
    else:
        allowed, covered = vocabulary(train, args.coverage, eos)
    vocab = target.model.config.get_text_config().vocab_size
    slots = torch.full((vocab,), -1, dtype=torch.long)
    slots[torch.tensor(allowed)] = torch.arange(len(allowed))
    head = DraftHead(head_config(target.model), layers)
    if args.warm:
        warm_start(head, Path(args.warm))
    student = HeadStudent(head, target.model, torch.tensor(allowed), unroll=args.unroll, columns=columns,
                          regression=args.regression, noise=args.noise)
    heldout_ids = sorted({id_ for _, _, id_ in heldout})
    heldout = evaluation_set(heldout, args.eval_shards, args.eval_prefix, args.heldout_examples, args.seed)
    trainer = Trainer(student, train, heldout, slots, pad, args.lr, args.batch_size, args.seed, autocast=args.bf16,
                      decay_steps=args.decay_steps)
    out = Path(args.out)
    state_file = out / "state.pt"
    best = {"score": -1.0, "state": None, "step": 0, "chain": None}
    if args.resume and state_file.is_file():
        saved = torch.load(state_file, weights_only=False)
        trainer.restore(saved["trainer"])
        best = saved["best"]
    elif state_file.is_file():
        raise SystemExit(f"{out} holds a run: pass --resume")
    started = time.monotonic()
    print(f"{len(train)} train / {len(heldout)} held-out sequences, {info['answer_tokens']} answer tokens, "
          f"vocab {len(allowed)} ({covered:.2%} of training answer tokens), layers {layers}, unroll {args.unroll}", flush=True)

    def write_head(directory: Path, step: int, chain: list[float], score: float) -> None:
        """The head as it stands, loadable by ``--draft`` (its held-out figures are those of ``step``)."""
        head.eval()
        meta = {"target": identity, "top_vocab": allowed, "training": {
            "answers": "examples/answers", "sequences": info["sequences"], "answer_tokens": info["answer_tokens"],
            "heldout_sequences": len(heldout), "eval_shards": args.eval_shards, "eval_prefix": args.eval_prefix, "seed": args.seed, "steps": trainer.step, "best_step": step,
            "unroll": args.unroll, "lr": args.lr, "decay_steps": args.decay_steps, "bf16": args.bf16, "minutes_this_run": args.minutes, "batch_size": args.batch_size, "warm_start": args.warm or None,
            "vocab_coverage": covered, "heldout_chain_agreement": chain, "expected_accepted_3": score}}
        save_head(directory, head, {**meta, "layer": head.config_dict})
        head.train()

    def evaluate():
        chain = trainer.chain_agreement(3)
        score = chain[0] + chain[0] * chain[1] + chain[0] * chain[1] * chain[2]  # expected accepted of 3
        if score > best["score"]:
            best.update(score=round(score, 4), state={k: v.clone() for k, v in student.state().items()},
                        step=trainer.step, chain=chain)
        trainer.history.append({"step": trainer.step, "chain": chain, "score": round(score, 4),
                                "minutes": round((time.monotonic() - started) / 60, 2)})
        print(f"step {trainer.step}: held-out agreement by position {chain}, expected accepted {score:.3f}", flush=True)
        if args.snapshots:
            write_head(out / f"step-{trainer.step}", trainer.step, chain, round(score, 4))

    if trainer.step == 0:
        evaluate()
    while True:
        left = args.minutes - (time.monotonic() - started) / 60
        if left <= 0.1 or (args.steps and trainer.step >= args.steps):
            break
        target_steps = trainer.step + args.eval_every
        if args.steps:
            target_steps = min(target_steps, args.steps)
        trainer.run(Budget(steps=target_steps, minutes=left), eval_every=10**9)
        evaluate()
        out.mkdir(parents=True, exist_ok=True)
        save_atomically({"trainer": trainer.checkpoint(), "best": best}, state_file)
        if trainer.step - best["step"] >= args.patience:
            print("early stop: no held-out gain", flush=True)
            break
    out.mkdir(parents=True, exist_ok=True)
    save_atomically({"trainer": trainer.checkpoint(), "best": best}, state_file)
    head.load_state_dict(best["state"])
    write_head(out, best["step"], best["chain"], best["score"])
    (out / "history.json").write_text(json.dumps(trainer.history))
    (out / "heldout.jsonl").write_text("".join(json.dumps(p) + "\n" for p in heldout_prompts(heldout_ids)))
    print(json.dumps({"out": str(out), "best": best["chain"], "score": best["score"], "step": best["step"],
                      "steps": trainer.step}), flush=True)


def heldout_prompts(ids: list[str]) -> list[dict]:
    """The held-out prompts as a prompt file (to benchmark on what the head never saw): templates
    (``tpl-``), the prompts composed from the target's requests (``gen-``), and the request-writing
    prompts themselves (``req-``); conversations (``conv-``) as their messages, follow-ups (``fu-``)
    by the first turn they follow, copy tasks (``copy-``) rebuilt from their seed, hand-written
    prompts (``hand-``) from their file."""
    from make_answers import HANDWRITTEN, ROUNDS, copy_tasks, meta_prompts

    known = {f"tpl-{p.id}": {"prompt": p.text, "scenario": p.scenario} for p in read_file(HERE / "train-prompts.jsonl")}
    for line in (ANSWERS / "prompts.jsonl").read_text().splitlines():
        row = json.loads(line)
        known[row["id"]] = {"prompt": row["prompt"], "scenario": row["scenario"]}
    known.update({row["id"]: {"prompt": row["text"], "scenario": "request-writing"}
                  for round_ in ROUNDS for row in meta_prompts(round_)})
    for line in (ANSWERS / "conversations.jsonl").read_text().splitlines():
        row = json.loads(line)
        known[row["id"]] = {"messages": row["messages"], "scenario": row["scenario"]}
    # a follow-up's prompt shows a first turn's answer to the target: named by that turn (make_answers.first_turns)
    follow_up = {i: {"from": i.removeprefix("fu-"), "scenario": "follow-up"} for i in ids if i.startswith("fu-")}
    if HANDWRITTEN.is_file():
        known.update({p.id: {"prompt": p.text, "scenario": p.scenario} for p in read_file(HANDWRITTEN)})
    if any(i.startswith("copy-") for i in ids):
        known.update({row["id"]: {"prompt": row["text"], "scenario": "copy"} for row in copy_tasks()})
    return [{"id": i, **(follow_up.get(i) or known[i])} for i in ids]


def warm_start(head: DraftHead, directory: Path) -> None:
    """Start from a trained head's fc and decoder layer, and its ``fuse`` where it read the same
    hidden states; else a fused head's ``fuse`` starts by passing the last hidden state through
    (so step 0 drafts exactly as that head did)."""
    from safetensors.torch import load_file

    state = load_file(directory / "head.safetensors")
    layers = tuple((read_meta(directory) or {}).get("feature_layers", (-1,)))
    if layers == head.feature_layers and head.fuse is not None:
        head.load_state_dict(state)  # the same features: everything carries over
        return
    state = {k: v for k, v in state.items() if not k.startswith("fuse.")}
    missing, unexpected = head.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("fuse.") for k in missing), (missing, unexpected)
    if head.fuse is not None:
        hidden = head.config.hidden_size
        top = head.feature_layers.index(-1)
        with torch.no_grad():
            head.fuse.weight.zero_()
            head.fuse.weight[:, top * hidden : (top + 1) * hidden] = torch.eye(hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("teacher", "train"))
    parser.add_argument("--minutes", type=float, default=9.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--shards", default="*", help="teacher: only answer files matching this glob (e.g. 'conversations/*')")
    parser.add_argument("--out", default="runs/head")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--feature-layers", default="2,15,-1")
    parser.add_argument("--unroll", type=int, default=3)
    parser.add_argument("--regression", type=float, default=0.0)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--coverage", type=float, default=0.99)
    parser.add_argument("--vocab-size", type=int, default=0, help="fixed size instead of --coverage")
    parser.add_argument("--vocab-from", default="", help="a head's output ids instead (e.g. the warm start's, on a subset of the data)")
    parser.add_argument("--warm", default=str(SHIPPED), help="a head to start from ('' for a fresh one)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--decay-steps", type=int, default=0, help="cosine decay of --lr to a tenth over N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (AMX): faster steps")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--patience", type=int, default=200)
    parser.add_argument("--heldout-examples", type=int, default=160)
    parser.add_argument("--eval-shards", default="*", help="held-out agreement only on teacher files matching this glob")
    parser.add_argument("--eval-prefix", default="", help="... and on prompt ids starting with this")
    parser.add_argument("--snapshots", action="store_true", help="also write the head at every evaluation (OUT/step-N), "
                        "to choose by acceptance on other prompts (benchmarks/drafter_report.py --draft OUT/step-N)")
    args = parser.parse_args()
    if args.stage == "teacher":
        stage_teacher(args.minutes, args.batch_size, args.shards)
    else:
        stage_train(args)


if __name__ == "__main__":
    main()
