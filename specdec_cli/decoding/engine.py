"""The speculative loop: draft → verify in one target forward → accept → keep the accepted path.

A chain of drafts is a tree with one child per node, so every round runs the same steps: the
drafter proposes a chain or a tree, the target scores the root (the last emitted token) and every
node in one forward, the acceptance rule picks the path it keeps, and the cache and the drafter's
features keep exactly that path. Verify looks at the shape: a chain is fed causally, on the kernels
whose rows equal one-token forwards bit for bit (runtime/rowwise_attention.py), a tree under its
ancestor mask (tree.py). Accept does not: the target's token at each position is its argmax, or
under sampling the winner of a race under noise fixed by the seed and the position (coupling.py),
and a draft token is kept when it is that token. Only the opt-in rules judge a chain on q: the
standard rule (min(1, p/q) and the residual draw) and the lossy ones.

It knows nothing of terminals or command lines. ``SpeculativeEngine.generate`` yields one
``RoundEvent`` per verify round; the live view, JSON output and statistics all consume those.
K = 0 is plain decoding through the very same loop, which is what makes the two comparable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator

import torch

from ..errors import PromptTooLong, UserError
from ..runtime.lean_forward import Block, fallback_forwards, forward_many
from .acceptance import AcceptRule, SamplingParams, distribution, greedy_accept, relaxed_accept
from .blocks import padded_chain, padded_tree
from .coupling import PositionNoise, race_scores
from .control.batch_rows import StepCosts, batch_lengths
from .drafters.base import Draft, Drafter, Needs, TreeDrafting, Verified, drafts_trees, parts, top_ids
from .drafting import Decision, decide, gains, propose
from .request import Request
from .shared_prefix import copy_prefix, plan_sharing
from .events import CONTEXT, EOS, MAX_NEW_TOKENS, RoundEvent
from .kv import context_length, input_device, keep_rows, reserved_cache
from .rules import check_tree_rule
from .schedule import FixedK, KSchedule
from .tree import Tree, greedy_tree_accept, tree_masks, verify_tree

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.cache_utils import DynamicCache

    from ..runtime.reserved_cache import ReservedCache

__all__ = ["FixedK", "KSchedule", "RoundEvent", "SpeculativeEngine"]

DONE = object()  # the requests are all read


@dataclass
class Pending:
    """A round between its draft and its verify forward: what ``_finish`` reads."""

    want: int
    draft: Draft
    offer_s: float
    draft_s: float
    block: torch.Tensor  # index 0 the root (the last emitted token), i the i-th draft node
    tree: Tree | None  # None: a chain
    cached: int


class SpeculativeEngine:
    def __init__(
        self, target: PreTrainedModel, drafter: Drafter | None, eos_token_ids: set[int], block_plan: dict[int, int] | None = None
    ):
        self.target = target
        self.block_plan = block_plan or {}  # verify-block length → the cheaper length to run it at (blocks.py)
        self.drafter = drafter
        self.eos_token_ids = set(eos_token_ids)
        self.vocab_size = target.config.get_text_config().vocab_size
        self.context_length = context_length(target)
        # What the drafter reads of the target's forward, declared once: only a drafter that reads the
        # target's features gets them, plain decoding and the other drafters pay nothing.
        self.needs = drafter.needs if drafter is not None else Needs()
        learned = parts(drafter)[1]
        self._extra = {"output_hidden_states": list(self.needs.features)} if self.needs.features else {}
        # Trees, decided once: the drafter's every draft is one (K its node budget), and the learned
        # drafter a schedule may ask for one (Take.TREE), where it drafts them.
        self.drafts_trees = drafts_trees(drafter)
        self._trees = isinstance(learned, TreeDrafting)
        # Several answers' blocks in one forward (``run``'s batches) where the target runs the lean forward.
        self.batched = forward_many(target)
        self.step_costs = StepCosts()  # a batched forward's seconds by what it holds: what a batch's draft rows cost

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], *, k: int | KSchedule, max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                 seed: int = 0, record_logits: bool = False, rule: AcceptRule = AcceptRule()) -> Iterator[RoundEvent]:
        """One answer's rounds (``request`` says what the settings mean)."""
        request = self.request(prompt_ids, k=k, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                               record_logits=record_logits, rule=rule)
        for _, event in self.run([request]):
            yield event

    def request(self, prompt_ids: list[int], *, k: int | KSchedule, max_new_tokens: int,
                sampling: SamplingParams = SamplingParams(), seed: int = 0, record_logits: bool = False,
                rule: AcceptRule = AcceptRule(), key: object = None) -> Request:
        """An answer to decode, once it is found sound (a UserError says why not). ``rule`` other than
        exact judges p and q (acceptance.py): ``standard`` exactly, the others lossily (opt-in, and every
        caller that passes one must say so in its output).

        Sampling is drafter-invariant (coupling.py): the answer's i-th token is fixed by ``seed``, i
        and the target's distribution there, so the same seed gives the same text at every K, with
        every drafter, plainly and batched. Any other rule draws from a generator seeded with ``seed``,
        whose draws depend on the drafts: its text is not invariant."""
        schedule = FixedK(k) if isinstance(k, int) else k
        try:
            budget = self._budget(prompt_ids, max_new_tokens, schedule, rule)
        except Exception:
            schedule.end()
            raise
        device = input_device(self.target)
        return Request(
            schedule, None, torch.tensor(prompt_ids, dtype=torch.long), len(prompt_ids), budget,
            limit=MAX_NEW_TOKENS if budget == max_new_tokens else CONTEXT, device=device, sampling=sampling,
            noise=None if sampling.greedy else PositionNoise(seed, self.vocab_size, len(prompt_ids)),
            generator=None if rule.raced else torch.Generator(device=device).manual_seed(seed),
            rule=rule, record_logits=record_logits, key=key,
        )

    @torch.inference_mode()
    def run(self, requests: Iterable[Request], batch: int = 1) -> Iterator[tuple[Request, RoundEvent]]:
        """Decode ``requests`` (read lazily), up to ``batch`` at once: one target forward a step caches
        the prompts that joined and verifies every other answer's round (continuous batching: one that
        finishes frees its place for the next). Each answer has its own cache, drafter (a fork of the
        engine's) and schedule, and its tokens are the ones it gets alone (the forward computes each
        row as its own forward does: runtime/lean_forward.forward_many). Yields each round's event
        with its request, answers interleaved. ``requests`` may yield None for "none ready yet" (a
        slow pipe): the running answers go on; with none running it must block instead."""
        self.check_batch(batch)
        pending, exhausted = iter(requests), False
        drafters = [self.drafter] if self.drafter is not None else []
        running: list[Request] = []
        while True:
            while len(running) < batch and not exhausted:
                request = next(pending, DONE)
                exhausted = request is DONE
                if request is None or exhausted:  # None: none is ready yet, the running ones go on
                    break
                request.drafter = None if self.drafter is None else (drafters.pop() if drafters else self.drafter.fork())
                if request.drafter is not None:
                    request.drafter.reset()
                request.cache = reserved_cache(self.target.config)
                request.fallbacks = fallback_forwards(self.target)  # the prompt's are the first event's
                running.append(request)
            if not running:
                if exhausted:
                    return
                continue  # nothing ready and nothing running: the requests block until one is
            for request, event in self._step(running):
                if event is None:
                    continue
                request.schedule.observe(event)
                yield request, event
                if event.finished or request.left == 0:
                    running.remove(request)
                    request.schedule.end()
                    if request.drafter is not None:
                        drafters.append(request.drafter)

    def check_batch(self, batch: int) -> None:
        """A batch above 1 runs on the lean forward alone (forward_many); refused on any other."""
        if batch > 1 and self.batched is None:
            raise UserError(f"decoding {batch} prompts at once needs specdec's lean forward (Llama-architecture targets "
                            "on int8/int4 kernels); this target runs transformers' forward, one prompt at a time")

    def _step(self, running: list[Request]) -> list[tuple[Request, RoundEvent | None]]:
        """One target forward for every running answer: a new one's prompt (no event), the others' rounds.
        Prompts that cannot share a forward (dense copies: dense_prefill.py) are cached alone first."""
        if len(running) == 1 or (self.batched is not None and not self.batched.batches_prompts):
            for request in running:
                if not request.prompted:
                    self._prompt(request, *self.prompt_cache(request.tokens, request.cache))
            if len(running) == 1:
                request = running[0]
                pending = self._plan(request)
                started = time.perf_counter()
                out = self._verify(request.cache, pending.block, pending.tree, pending.cached, request.device)
                return [(request, self._finish(request, pending, out, time.perf_counter() - started))]
        rounds = [r for r in running if r.prompted]
        joining = self._share([r for r in running if not r.prompted], rounds)
        computed = [r for r, _ in joining if r.unshared]  # the joining prompts not wholly copied
        prompts = [(r.unshared, r.shared) for r in computed]
        blocks = [Block(r.tokens[r.shared : -1], r.cache, keep=1) for r in computed]
        decisions = []
        for request in rounds:
            request.schedule.context(request.cached)
            decisions.append(decide(request, self.drafts_trees))
        caps = self._caps(rounds, decisions, prompts)
        plans = [self._plan(r, d, c) for r, d, c in zip(rounds, decisions, caps)]
        blocks += [self._block(p, r) for p, r in zip(plans, rounds)]
        started = time.perf_counter()
        outs = self.batched.forward_many(blocks, **self._extra) if blocks else []
        forward_s = time.perf_counter() - started
        if rounds and not prompts:  # a prompt's rows run another attention: its steps would mislead
            self.step_costs.observe([(p.block.shape[0], p.cached) for p in plans], forward_s)
        outs = iter(outs)
        for request, copied in joining:
            self._prompt(request, request.cache, next(outs) if request.unshared else None, copied)
        return [(r, None) for r, _ in joining] + [(r, self._finish(r, p, next(outs), forward_s, len(rounds))) for p, r in zip(plans, rounds)]

    def _share(self, joining: list[Request], cached: list[Request]) -> list[tuple[Request, torch.Tensor | None]]:
        """The prompts that join this step's forward, each holding the prefix it shares with a cached
        answer's prompt (shared_prefix.py: on specdec's attention op), with that answer's prompt features
        (None: none shared, or no drafter reads them); one that gains by waiting a step for a prompt
        joining in this one is left out."""
        if not (joining and self.batched.shares_prefixes):
            return [(r, None) for r in joining]
        found = []
        for request, source, length in plan_sharing(joining, cached, self.batched.prefix_up_to):
            if length:
                copy_prefix(source.cache, request.cache, length)
                request.shared = length
            found.append((request, source.prompt_features if length else None))
        return found

    def _caps(self, rounds: list[Request], decisions: list[Decision], prompts: list[tuple[int, int]]) -> list[int | None]:
        """Each round's longest chain in this step, chosen for the batch as a whole by what its rows
        cost (control/batch_rows.py) beside the prompts' blocks, (rows, cached positions); None: as
        decided (a fixed K, a tree, or costs not known yet)."""
        if len(rounds) < 2 or not self.step_costs.known():
            return [None] * len(rounds)
        found = [gains(r, d) for r, d in zip(rounds, decisions)]
        if all(g is None for g in found):
            return [None] * len(rounds)
        kept = [(1 + (d.want if g is None else 0), r.cached) for r, d, g in zip(rounds, decisions, found)]
        return batch_lengths([g and g[0] for g in found], self.step_costs.seconds(prompts + kept),
                             [self.step_costs.row_s(r.cached + 1) for r in rounds], [g[1] if g else 0.0 for g in found])

    def _block(self, pending: Pending, request: Request) -> Block:
        """A round's block in a forward of several: a chain causally, a tree under its ancestor mask."""
        if pending.tree is None:
            return Block(pending.block, request.cache)
        mask = tree_masks(self.target.config, pending.tree, pending.cached, torch.bool)
        return Block(pending.tree.tokens, request.cache, pending.cached + pending.tree.depths(), mask)

    def _prompt(self, request: Request, cache, out, copied: torch.Tensor | None = None) -> None:
        """The prompt is cached: the drafter reads it (its features, where it needs them: a shared
        prefix's are ``copied``, its source's, and a batch keeps them for the prompts that share its own)."""
        request.cache, request.prompted = cache, True
        rows = request.prompt_length - 1
        if rows == 0 or request.drafter is None:
            return
        features = None
        if self.needs.features:
            own = [] if out is None else [self._features(out, slice(0, rows - request.shared))]
            features = torch.cat([copied[: request.shared], *own]) if request.shared else own[0]
            if self.batched is not None and self.batched.shares_prefixes:  # only what a prefix may copy
                request.prompt_features = features[: self.batched.prefix_up_to].clone()
        request.drafter.observe(Verified(request.tokens, request.prompt_length, features=features))

    def _plan(self, request: Request, decision: Decision | None = None, cap: int | None = None) -> Pending:
        """A round up to its verify forward: decide and draft (a chain, at most ``cap`` long where a
        batch caps it, or a tree), and the block to verify."""
        cached = request.cached
        if decision is None:
            request.schedule.context(cached)
            decision = decide(request, self.drafts_trees)
        started = time.perf_counter()  # the decision's own seconds are its decide_s
        want, draft = propose(request, decision, cap)
        draft_s = decision.decide_s + time.perf_counter() - started
        block = torch.cat([request.tokens[-1:], draft.tokens])
        tree = None if draft.parents is None else Tree(block, (-1, *draft.parents))
        return Pending(want, draft, decision.offer_s, draft_s, block, tree, cached)

    def _finish(self, request: Request, pending: Pending, out, forward_s: float, batch: int = 1) -> RoundEvent:
        """A round after its verify forward: accept, commit the kept path (cache and tokens), show the
        drafters what the target said, and the event."""
        draft, tree, block = pending.draft, pending.tree, pending.block
        accept_started = time.perf_counter()
        logits = out.logits[0, : block.shape[0], : self.vocab_size].float()
        path, token = self._accept(request, draft, tree, logits)
        verified_at = time.perf_counter()
        kept = draft.tokens[: len(path)] if tree is None else block[path]
        emitted, eos = self._cut(kept.tolist() + [token], request.left)
        rows = self._commit(request, path, emitted)
        rows_kept = slice(0, len(rows)) if rows[-1] == len(rows) - 1 else rows  # a prefix: sliced, not gathered
        finished = eos or request.left == 0
        self._observe(request, block, logits, out, rows_kept, finished)
        complete = len(emitted) == len(path) + 1  # neither EOS nor the budget cut the path short
        now = fallback_forwards(self.target)
        fallbacks, request.fallbacks = now - request.fallbacks, now
        return RoundEvent(
            source=draft.source if len(draft) or draft.confidence else "",
            catchup_s=draft.catchup_s,
            offer_s=pending.offer_s,
            confidence=draft.confidence,
            k=pending.want,
            drafted=draft.tokens.tolist(),
            accepted=min(len(path), len(emitted)),  # drafts past an EOS or the budget were not used
            token=token if complete else None,
            emitted=emitted,
            draft_s=pending.draft_s,
            verify_s=forward_s + verified_at - accept_started,
            finished=finished,
            logits=logits[rows_kept].cpu() if request.record_logits else None,
            stop=EOS if eos else (request.limit if finished else None),
            batch=batch,
            cached=pending.cached,
            fallback_forwards=fallbacks,
            parents=None if tree is None else tuple(draft.parents),
            path=None if tree is None else rows[1:],
            turned_down=None if tree is None else
            [int(tree.tokens[c]) for c in tree.children(rows[-1])] if complete else [],
            other_s=time.perf_counter() - verified_at,  # before the schedule observes: its work is its own
        )

    def _commit(self, request: Request, path: list[int], emitted: list[int]) -> list[int]:
        """Keep the accepted path: its block rows stay in the cache (the root and the kept nodes; the
        rest, padding included, go), the emitted tokens join the request's. Returns the rows kept."""
        rows = [0, *path][: len(emitted)]
        keep_rows(request.cache, request.cached, rows)
        request.tokens = torch.cat([request.tokens, torch.tensor(emitted, dtype=torch.long)])
        request.produced += len(emitted)
        return rows

    def _observe(self, request: Request, block, logits, out, rows_kept, finished: bool) -> None:
        """Show the drafter what the target said of the round: the context now, its successors and features."""
        if request.drafter is None:
            return
        successors = top_ids(logits.cpu(), self.needs.successors) if self.needs.successors else None
        request.drafter.observe(Verified(request.tokens, request.prompt_length, block, successors,
                                      self._features(out, rows_kept), finished))

    @torch.inference_mode()
    def prompt_cache(self, tokens: torch.Tensor, cache=None) -> tuple[ReservedCache | DynamicCache, object]:
        """The target's cache of every prompt token but the last (the invariant of every round: the
        cache holds all tokens but the last emitted one), and the forward's output (None for a
        one-token prompt). Its only logits asked for are the last row's: a quantised target runs
        it as a prompt (runtime/dense_prefill.py), which a verify block, scoring every row, never is."""
        cache = reserved_cache(self.target.config) if cache is None else cache
        if tokens.shape[0] < 2:
            return cache, None
        out = self.target(tokens[None, :-1].to(input_device(self.target)), cache=cache, use_cache=True,
                          logits_to_keep=1, **self._extra)
        return cache, out

    def _budget(self, prompt_ids: list[int], max_new_tokens: int, schedule: KSchedule, rule: AcceptRule) -> int:
        """The tokens this run may add, once the request is found sound."""
        if self.drafts_trees or schedule.trees:
            check_tree_rule(rule)
        if schedule.trees and self.drafter is not None and not self._trees:
            raise ValueError(f"the schedule may plan trees, and drafter {self.drafter.name!r} has no learned drafter "
                             "that drafts them (decoding/drafters/base.TreeDrafting)")
        if not prompt_ids:
            raise UserError("the prompt is empty")
        if not self.context_length:
            return max_new_tokens
        PromptTooLong.check(len(prompt_ids), self.context_length)
        return min(max_new_tokens, self.context_length - len(prompt_ids))

    def _verify(self, cache, block: torch.Tensor, tree: Tree | None, cached: int, device):
        """The target's one forward over the block, where a longer forward is cheaper run longer
        (blocks.py): a chain causally, padded after its last token; a tree under its ancestor mask,
        copies of the root hung under the root. No real row sees the padding, acceptance reads the
        real rows alone, and the padding's cache entries go with the rest of what was not kept."""
        length = self.block_plan.get(block.shape[0], block.shape[0])
        if self.context_length:
            length = min(length, self.context_length - cached)
        if tree is None:
            block = padded_chain(block, length)
            return self.target(block[None].to(device), cache=cache, use_cache=True, logits_to_keep=block.shape[0],
                               **self._extra)
        return verify_tree(self.target, cache, padded_tree(tree, length), device, **self._extra)

    def _accept(self, request: Request, draft: Draft, tree: Tree | None, logits) -> tuple[list[int], int]:
        """The kept path (block indices, the root left out) and the target's own next token: the
        longest path whose every token is the target's choice, the argmax of its scores (the logits
        under greedy; under sampling the race's, coupling.py: row i scores the position after block
        node i, at its depth), chain or tree alike. Any other rule judges a chain's drafts on p and q
        instead (acceptance.py)."""
        sampling, rule = request.sampling, request.rule
        scores = logits
        if not sampling.greedy and rule.raced:  # every other rule judges p and q instead
            start = request.tokens.shape[0]
            depths = range(logits.shape[0]) if tree is None else tree.depths().tolist()
            scores = race_scores(distribution(logits, sampling), request.noise.rows(start + d for d in depths))
        if tree is not None:
            return greedy_tree_accept(tree, scores)
        drafts = draft.tokens.to(logits.device)
        if rule.raced:
            accepted, token = greedy_accept(drafts, scores)
        else:
            accepted, token = relaxed_accept(rule, drafts, draft.probs, logits, sampling, request.generator)
        return list(range(1, accepted + 1)), token

    def _features(self, out, rows: slice | list[int]) -> torch.Tensor | None:
        """The target's features of the block positions that stay cached, for a drafter that reads them."""
        return gather_features(out.hidden_states, self.needs.features, rows) if self.needs.features else None

    def _cut(self, emitted: list[int], room: int) -> tuple[list[int], bool]:
        """Honour EOS and the token budget inside a block; True: an EOS ended it."""
        for i, token in enumerate(emitted[:room]):
            if token in self.eos_token_ids:
                return emitted[: i + 1], True
        return emitted[:room], False


def gather_features(hidden_states, layers: tuple[int, ...], rows=slice(None)) -> torch.Tensor:
    """The rows of batch 0 of the chosen hidden states, concatenated along the feature axis: what a head drafts on."""
    return torch.cat([hidden_states[i][0][rows] for i in layers], dim=-1)
