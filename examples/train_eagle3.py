"""Fine-tune a head in vLLM's own EAGLE-3 layout, starting from `specdec export-head`'s map of the
shipped head, on the target's states exactly as vLLM hands them over (aux layers before each layer,
the last one before the final norm), so that nothing in vLLM has to be approximated.

    python examples/train_eagle3.py INIT_DIR OUT_DIR [--sequences 240] [--epochs 2] [--unroll 3]

INIT_DIR: an eagle3 directory (`specdec export-head ... --out INIT_DIR`). The training answers are
the committed examples/answers shards (token ids of the target's own answers); the last shard is
held out and reported. The lm_head (the target's rows over the draft vocabulary) stays frozen; fc,
the layer and the norms train against the float32 target's distribution over the draft vocabulary,
unrolled: draft step j reads step j-1's pre-norm outputs as vLLM's drafted positions do.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import signal
import sys
import time
from pathlib import Path

import torch

from specdec_cli.export.eagle3 import load_eagle3, save_eagle3
from specdec_cli.export.head_export import aux_states, target_forward
from specdec_cli.pairs.loading import load
from specdec_cli.pairs.registry import load_registry

ANSWERS = Path(__file__).parent / "answers" / "answers"


def sequences(paths, limit: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rows = []
    for path in paths:
        with gzip.open(path, "rt") as handle:
            rows += [(r["ids"], r["start"]) for r in map(json.loads, handle)]
    random.Random(seed).shuffle(rows)
    return rows[:limit]


def teacher(model, head, ids: list[int], start: int, top: int = 32):
    """Per position: vLLM's aux states, the embeddings, the target's top draft-vocabulary log-probs."""
    hidden, logits = target_forward(model, ids, for_training=True)  # no_grad: fc trains on these states
    aux = aux_states(hidden, head.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    allowed = head.d2t + torch.arange(head.d2t.numel())
    logp = torch.log_softmax(logits[:, allowed], dim=-1)
    values, index = logp.topk(top, dim=-1)
    return {"aux": aux.half(), "ids": torch.tensor(ids), "start": start, "top_v": values.half(), "top_i": index}


def loss_and_hits(head, model, example, unroll: int):
    """Soft cross-entropy over the answer positions at each unrolled step, and top-1 hits per step."""
    ids, aux = example["ids"], example["aux"].float()
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids).float()
    # Index t reads token t and the state at t - 1 and predicts the target's token after t (logits at t).
    e, hidden = embeds[1:], head.combine(aux[:-1])
    first = max(example["start"] - 1, 0)
    want_v, want_i = example["top_v"].float()[1:], example["top_i"][1:]
    probs = torch.softmax(want_v, dim=-1)
    total, hits = 0.0, []
    for step in range(unroll):
        prenorm = head(e, hidden)
        logits = head.lm_head(head.norm * prenorm * torch.rsqrt(prenorm.pow(2).mean(-1, keepdim=True) + head.eps))
        logp = torch.log_softmax(logits, dim=-1)[first:]
        total = total + -(probs[first:] * logp.gather(-1, want_i[first:])).sum(-1).mean() * (0.8 ** step)
        hits.append(float((logp.argmax(-1) == want_i[first:, 0]).float().mean()))
        # The next step's position t reads this step's output at t - 1, as a drafted position does.
        hidden = torch.cat([hidden[:1], prenorm[:-1]], dim=0)
    return total, hits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("init", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--sequences", type=int, default=240)
    parser.add_argument("--heldout", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--unroll", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--skip-before", action="store_true", help="Do not measure the starting point first.")
    args = parser.parse_args()
    torch.manual_seed(0)
    pair = load_registry().pair(None)
    spec = type(pair.target)(pair.target.source, dtype="float32", device_map="cpu")
    model = load(spec).model.eval()
    head = load_eagle3(args.init)
    head.lm_head.weight.requires_grad_(False)
    shards = sorted(ANSWERS.glob("shard-*.jsonl.gz"))
    train_rows = sequences(shards[:-1], args.sequences)
    held_rows = sequences(shards[-1:], args.heldout)
    started = time.time()
    clip = lambda rows: [(ids[: args.max_tokens], start) for ids, start in rows if start < min(len(ids), args.max_tokens) - 8]
    held = [teacher(model, head, ids, s) for ids, s in clip(held_rows)]
    history = {} if args.skip_before else {"before": evaluate(head, model, held, args.unroll)}
    print(json.dumps({**history, "s": round(time.time() - started)}), file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    optimiser = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    steps = args.epochs * len(clip(train_rows))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda i: min(1.0, (i + 1) / 20) * max(0.1, 1 - i / max(steps, 1)))
    cache, done = [], 0
    try:
        for epoch in range(args.epochs):
            source = clip(train_rows) if epoch == 0 else cache
            for n, item in enumerate(source):
                example = teacher(model, head, *item) if epoch == 0 else item
                if epoch == 0:
                    cache.append(example)
                head.train()
                loss, hits = loss_and_hits(head, model, example, args.unroll)
                optimiser.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                optimiser.step()
                schedule.step()
                done += 1
                if n % 10 == 0:
                    print(json.dumps({"epoch": epoch, "n": n, "loss": round(float(loss.detach()), 4),
                                      "hits": [round(h, 3) for h in hits], "s": round(time.time() - started)}),
                          file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(json.dumps({"stopped_after_steps": done, "s": round(time.time() - started)}), file=sys.stderr, flush=True)
    history["after"] = evaluate(head, model, held, args.unroll)
    print(json.dumps({"after": history["after"], "steps": done, "s": round(time.time() - started)}), file=sys.stderr, flush=True)
    head.eval()
    provenance = json.loads((args.init / "specdec-export.json").read_text())
    provenance.update(map="trained in vLLM's layout by examples/train_eagle3.py, starting from the map",
                      training={"steps": done, "sequences": len(cache), "heldout": len(held), "epochs": args.epochs, "unroll": args.unroll,
                                "lr": args.lr, "max_tokens": args.max_tokens, "minutes": round((time.time() - started) / 60, 1),
                                "heldout_agreement": history})
    save_eagle3(args.out, head, provenance)
    print(json.dumps(history, indent=1))


def evaluate(head, model, held, unroll) -> list[float]:
    """Held-out top-1 agreement with the target at each unrolled step (teacher-forced chain)."""
    head.eval()
    sums = [0.0] * unroll
    with torch.no_grad():
        for example in held:
            _, hits = loss_and_hits(head, model, example, unroll)
            sums = [s + h for s, h in zip(sums, hits)]
    return [round(s / max(len(held), 1), 4) for s in sums]


if __name__ == "__main__":
    main()
