"""Where the shipped head's acceptance goes between specdec's loop and its eagle3 export in vLLM:
greedy, float32 target, K drafts a round, the same prompts as the recorded round trip.

    python benchmarks/export/eagle3_gap.py [--prompts examples/equivalence-prompts.jsonl] [--k 3]
        [--max-tokens 32] [--no-engine] [--no-hybrids] [--dtype float32] [--out benchmarks/export/eagle3-gap.json]

Rows (per-position acceptance = accepted at position j / rounds, as vLLM's /metrics counts it):
  engine     specdec's head in specdec's own engine (SpeculativeEngine + HeadDrafter, as `bench head:K`)
  drafter    the same HeadDrafter driven round by round the way vLLM schedules (first draft after the
             prefill's token, K drafts every round), against the target's greedy continuation
  export     the mapped export in the reference module (eagle3.Eagle3Head), drafting as vLLM's
             llm_base_proposer.propose does: confirmed positions read fc(target aux) and the next
             token, drafted ones the previous position's pre-norm output; the draft cache keeps the
             confirmed positions and this round's drafted ones (cropped each round)
  export:llama.cpp  the export for llama.cpp's layer (no attention biases), drafting the same way:
             llama.cpp's draft-eagle3 (common/speculative.cpp) feeds its layer as vLLM does
  hybrid:... specdec's head computed with one or more of the map's approximations switched on
             (APPROXIMATIONS), to price each: all on equals `export`, none equals `drafter`
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from specdec_cli.decoding.engine import SpeculativeEngine, gather_features
from specdec_cli.decoding.drafters.base import Verified
from specdec_cli.decoding.drafters.head import load_head
from specdec_cli.export.eagle3 import load_eagle3, map_head
from specdec_cli.decoding.head_files import read_head
from specdec_cli.export.head_export import aux_states, export_head, target_forward
from specdec_cli.pairs.loading import load
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt, eos_ids
from specdec_cli.prompts import read_file
from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.export.eagle3 import Stats
from specdec_cli.runtime.quantize import output_weight

# Each is one way the export differs from specdec's head (docs/export.md, "What maps exactly").
APPROXIMATIONS = {
    "last": "the last feature is the pre-norm state scaled by final_norm / mean rms, not the post-norm state",
    "norms": "q/k/v read two separately normed halves with mean scales, not one norm over fc's sum",
    "residual": "the layer's residual is vLLM's h, not fc's whole sum (embedding part and bias dropped)",
    "feedback": "a drafted position reads the previous output as h, skipping fc's feature half",
    "sink": "no position 0 (specdec's first token with an all-zero feature)",
}


class Hybrid:
    """specdec's head (decoding/head_network.py) written out in plain torch, with ``on`` approximations from
    APPROXIMATIONS; ``space`` "fc" or "feature" as eagle3.map_head's (what vLLM's h stands for)."""

    def __init__(self, spec: dict, stats, final_norm: torch.Tensor, rows: torch.Tensor, config: dict, on: set[str], space: str = "fc"):
        self.w = {k: v.float() for k, v in spec.items()}
        h = config["hidden_size"]
        self.h, self.eps, self.on, self.space, self.stats = h, config["rms_norm_eps"], set(on), space, stats
        self.w_e, self.w_f, self.b = self.w["fc.weight"][:, :h], self.w["fc.weight"][:, h:], self.w["fc.bias"]
        self.scale_last = final_norm / stats.last_rms
        self.rows = rows
        self.heads, self.kv, self.hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        self.rotary = LlamaRotaryEmbedding(LlamaConfig(**config))

    def feature(self, hidden: tuple, layers: tuple[int, ...]) -> torch.Tensor:
        """The fused feature f at every position (the last block pre-norm and scaled under "last")."""
        blocks = [hidden[-1] * self.scale_last if (i < 0 and "last" in self.on) else hidden[:-1][i] for i in layers]
        features = torch.cat(blocks, dim=-1)
        return features @ self.w["fuse.weight"].T if "fuse.weight" in self.w else features

    def forward(self, e: torch.Tensor, hv: torch.Tensor, start: int, cache: dict) -> torch.Tensor:
        """(T, H) embeddings and vLLM-side h → (T, H) outputs (specdec's guess, vLLM's pre-norm)."""
        g = hv if self.space == "fc" else hv @ self.w_f.T  # fc's feature half applied to f
        x = e @ self.w_e.T + g + self.b
        rmsv = lambda t: torch.sqrt(t.pow(2).mean(-1, keepdim=True) + self.eps)
        if "norms" in self.on:
            s_h = self.stats.hidden_over_x if self.space == "fc" else self.stats.feature_over_x
            u = (e @ self.w_e.T) / rmsv(e) * self.stats.embed_over_x + g / rmsv(hv) * s_h + self.b * self.stats.inverse_x
        else:
            u = x / rmsv(x)
        u = u * self.w["layer.input_layernorm.weight"]
        residual = hv if "residual" in self.on else x
        n = u.shape[0]
        a = lambda name: F.linear(u, self.w[f"layer.self_attn.{name}_proj.weight"])
        q = a("q").view(n, self.heads, self.hd).transpose(0, 1)[None]
        k = a("k").view(n, self.kv, self.hd).transpose(0, 1)[None]
        v = a("v").view(n, self.kv, self.hd).transpose(0, 1)[None]
        cos, sin = self.rotary(u[None], torch.arange(start, start + n)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if "k" in cache:
            k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
        cache["k"], cache["v"] = k, v
        total = k.shape[2]
        mask = torch.arange(total)[None, :] <= (torch.arange(n)[:, None] + total - n)
        groups = self.heads // self.kv
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask[None, None])
        r1 = F.linear(out[0].transpose(0, 1).reshape(n, -1), self.w["layer.self_attn.o_proj.weight"]) + residual
        m = r1 / rmsv(r1) * self.w["layer.post_attention_layernorm.weight"]
        mlp = lambda name: F.linear(m, self.w[f"layer.mlp.{name}_proj.weight"])
        return F.linear(F.silu(mlp("gate")) * mlp("up"), self.w["layer.mlp.down_proj.weight"]) + r1

    def drafted_h(self, out: torch.Tensor) -> torch.Tensor:
        """What a drafted position reads: the output itself (vLLM), or in the "fc" space fc's feature half of it (specdec)."""
        return out if ("feedback" in self.on or self.space == "feature") else out @ self.w_f.T

    def confirmed_h(self, f: torch.Tensor) -> torch.Tensor:
        return f @ self.w_f.T if self.space == "fc" else f

    def top(self, out: torch.Tensor, allowed: torch.Tensor) -> int:
        return int(allowed[(out @ self.rows.T).argmax(-1)])


def crop(cache: dict, keep: int) -> None:
    if "k" in cache:
        cache["k"], cache["v"] = cache["k"][:, :, :keep], cache["v"][:, :, :keep]


class ChainRunner:
    """Draft K tokens from a context of n tokens, vLLM's way, with a reference layer."""

    def __init__(self, step, confirmed_h, drafted_h, top, sink: bool):
        self.step, self.confirmed_h, self.drafted_h, self.top, self.sink = step, confirmed_h, drafted_h, top, sink

    def start(self, embeds: torch.Tensor, f: torch.Tensor) -> None:
        self.embeds, self.f, self.cache, self.done = embeds, f, {}, 0
        if self.sink:  # specdec's position 0: token 0 with an all-zero feature
            self.step(embeds[:1], torch.zeros_like(self.confirmed_h(f[:1])), 0, self.cache)

    def propose(self, n: int, k: int, embed) -> list[int]:
        """Positions done..n-2 read (token p+1, confirmed h at p); drafted ones the previous output."""
        base = 1 if self.sink else 0
        crop(self.cache, self.done + base)
        out = self.step(self.embeds[self.done + 1 : n], self.confirmed_h(self.f[self.done : n - 1]), self.done + base, self.cache)[-1:]
        self.done = n - 1
        tokens = [self.top(out[0])]
        for j in range(1, k):
            out = self.step(embed(torch.tensor([tokens[-1]])).float(), self.drafted_h(out), n - 2 + j + base, self.cache)
            tokens.append(self.top(out[0]))
        return tokens


class DrafterRunner:
    """specdec's HeadDrafter, handed the target's features as the engine hands them."""

    def __init__(self, drafter):
        self.drafter = drafter

    def start(self, rows: torch.Tensor, ids: list[int]) -> None:
        self.drafter.reset()
        self.rows, self.ids, self.count = rows, ids, 0

    def propose(self, n: int, k: int, embed) -> list[int]:
        if not self.count:  # the first round: the prompt and the target's first token
            self.prompt_length = n - 1
        seen = Verified(torch.tensor(self.ids[:n]), self.prompt_length, features=self.rows[self.count : n - 1])
        self.drafter.observe(seen)
        self.count = n - 1
        draft = self.drafter.propose(torch.tensor(self.ids[:n]), k, SamplingParams(), None)
        return draft.tokens.tolist()


def rounds(runner, ids: list[int], prompt_len: int, k: int, max_tokens: int, eos: set[int], embed) -> list[int]:
    """vLLM's schedule against the greedy continuation in ``ids``: accepted count per round."""
    n, produced, counts = prompt_len + 1, 1, []
    while produced < max_tokens and n <= len(ids) and not set(ids[prompt_len:n]) & eos:
        draft = runner.propose(n, k, embed)
        m = 0
        while m < k and n + m < len(ids) and draft[m] == ids[n + m] and ids[n + m - 1] not in eos:
            m += 1
        counts.append(m)
        n, produced = n + m + 1, produced + m + 1
    return counts


def summary(counts: list[int], k: int, drafted: int | None = None) -> dict:
    rounds_, drafted = len(counts), len(counts) * k if drafted is None else drafted
    return {"rounds": rounds_, "drafted": drafted, "accepted": sum(counts), "alpha": round(sum(counts) / max(drafted, 1), 4),
            "per_position": [round(sum(c > j for c in counts) / max(rounds_, 1), 4) for j in range(k)]}


def progress(started: float, what: str) -> None:
    print(f"[{time.perf_counter() - started:7.1f} s] {what}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--prompts", type=Path, default=Path("examples/equivalence-prompts.jsonl"))
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--head", type=Path, default=None, help="specdec head directory (default: the pair's)")
    parser.add_argument("--no-engine", action="store_true", help="skip the engine row (the slowest)")
    parser.add_argument("--dtype", default="float32", help="the target drafted against (its states and greedy "
                        "continuation); the exports are written from the float32 target, as served ones are")
    parser.add_argument("--no-hybrids", action="store_true", help="skip the hybrid rows (the exports alone)")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only (a quick check)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/export/eagle3-gap.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one layer at a time: small ops, faster on one thread of a busy machine
    started = time.perf_counter()
    pair = load_registry().pair(None)
    head_dir = args.head or Path(pair.drafter.head)
    loaded = load(type(pair.target)(pair.target.source, dtype="float32", device_map="cpu"))
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    target = model if args.dtype == "float32" else load(type(pair.target)(pair.target.source, dtype=args.dtype, device_map="cpu")).model.eval()
    eos = eos_ids(tokenizer, model.generation_config)
    embed = model.get_input_embeddings()
    meta, spec = read_head(head_dir)
    layers = tuple(meta["feature_layers"])
    drafter = load_head(head_dir, target, loaded.source, "float32")
    final_norm = model.model.norm.weight.detach().float()
    allowed = torch.tensor(sorted(meta["top_vocab"]), dtype=torch.long)
    rows = output_weight(model)[allowed].detach().float()
    prompts = [encode_prompt(tokenizer, p.text) for p in read_file(args.prompts)][: args.limit]

    progress(started, "loaded")
    results, continuations = {}, []
    extra = args.k + 1  # greedy tokens past the budget, so that the last round's drafts can be judged
    with torch.inference_mode():
        if args.no_engine:
            for ids in prompts:
                continuations.append(target.generate(torch.tensor([ids]), max_new_tokens=args.max_tokens + extra, do_sample=False)[0].tolist())
        else:  # specdec's engine (lossless: its output is the greedy continuation), then plain greedy past the budget
            engine, counts, drafted = SpeculativeEngine(target, drafter, eos), [], 0
            for ids in prompts:
                emitted = []
                for event in engine.generate(ids, k=args.k, max_new_tokens=args.max_tokens):
                    counts.append(event.accepted), emitted.extend(event.emitted)
                    drafted += len(event.drafted)
                so_far = torch.tensor([ids + emitted])
                continuations.append(so_far[0].tolist() if emitted[-1] in eos else
                                     target.generate(so_far, max_new_tokens=extra, do_sample=False)[0].tolist())
            results["engine"] = {**summary(counts, args.k, drafted),
                                 "note": "specdec's own schedule: no draft after a prefill token, K clipped to the budget at the end"}
    progress(started, f"engine {results.get('engine', {}).get('per_position')}")
    states = []
    for ids, full in zip(prompts, continuations):
        hidden, _ = target_forward(target, full)
        states.append((hidden, ids, full))

    def run(runner_for) -> dict:
        counts = []
        with torch.inference_mode():
            for hidden, ids, full in states:
                runner = runner_for(hidden, full)
                counts += rounds(runner, full, len(ids), args.k, args.max_tokens, eos, embed)
        return summary(counts, args.k)

    def drafter_runner(hidden, full):
        runner = DrafterRunner(drafter)
        runner.start(gather_features(tuple(t[None] for t in hidden[:-1]), layers), full)
        return runner
    results["drafter"] = run(drafter_runner)
    progress(started, f"drafter {results['drafter']['per_position']}")

    with tempfile.TemporaryDirectory() as tmp:  # the exports as `specdec export-head` writes them, and their scales
        export_head(head_dir, Path(tmp) / "vllm", "eagle3", lambda source: (model, tokenizer))
        export_head(head_dir, Path(tmp) / "llama.cpp", "eagle3", lambda source: (model, tokenizer), engine="llama.cpp")
        exports = {"fc": load_eagle3(Path(tmp) / "vllm"), "llama.cpp": load_eagle3(Path(tmp) / "llama.cpp")}
        provenance = json.loads((Path(tmp) / "vllm" / "specdec-export.json").read_text())
    progress(started, "export")
    stats = Stats(**provenance["stats"])  # the export's own scales, so that hybrid "all" is the export
    base = exports["fc"]
    exports["feature"] = map_head(spec, layers, base.config, final_norm, rows, base.d2t, base.t2d, stats, "feature").eval()
    for space, eagle in exports.items():
        aux_ids = eagle.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        top = lambda out, eagle=eagle: int(eagle.target_logits(out).argmax(-1))

        def export_runner(hidden, full, eagle=eagle, aux_ids=aux_ids, top=top):
            runner = ChainRunner(lambda e, h, s, c: eagle(e, h, s, c), eagle.combine, lambda o: o, top, sink=False)
            runner.start(embed(torch.tensor(full)).float(), aux_states(hidden, aux_ids))
            return runner
        results[f"export:{space}"] = run(export_runner)
        progress(started, f"export:{space} {results[f'export:{space}']['per_position']}")

    for space in () if args.no_hybrids else ("fc", "feature"):
        names = [a for a in APPROXIMATIONS if space == "fc" or a != "feedback"]  # the feature space feeds back exactly
        variants = [("all", set(names))] + [(f"all-{a}", set(names) - {a}) for a in names]
        variants += [(f"none+{a}", {a}) for a in names] + [("none", set())] * (space == "fc")
        for label, on in variants:
            hybrid = Hybrid(spec, stats, final_norm, rows, meta["layer"], on, space)

            def hybrid_runner(hidden, full, hybrid=hybrid):
                runner = ChainRunner(hybrid.forward, hybrid.confirmed_h, hybrid.drafted_h,
                                     lambda out: hybrid.top(out, allowed), sink="sink" not in hybrid.on)
                runner.start(embed(torch.tensor(full)).float(), hybrid.feature(hidden, layers))
                return runner
            results[f"hybrid:{space}:{label}"] = {**run(hybrid_runner), "approximations": sorted(on)}
            progress(started, f"hybrid:{space}:{label} {results[f'hybrid:{space}:{label}']['per_position']}")

    record = {"prompts": str(args.prompts), "dtype": args.dtype, "k": args.k, "max_tokens": args.max_tokens, "requests": len(prompts),
              "head": str(head_dir), "stats": stats.__dict__, "approximations": APPROXIMATIONS,
              "vllm_recorded": {"source": "benchmarks/export/eagle3-mapped-round-trip.json", "alpha": 0.0831,
                                "per_position": [0.2384, 0.0088, 0.0022]},
              "rows": results}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'row':<34} {'rounds':>6} {'alpha':>7}  per position")
    for name, row in results.items():
        print(f"{name:<34} {row['rounds']:>6} {row['alpha']:>7.3f}  {' / '.join(f'{p:.3f}' for p in row['per_position'])}")


if __name__ == "__main__":
    main()
