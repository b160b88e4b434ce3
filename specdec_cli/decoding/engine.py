"""The speculative loop: draft → verify in one target forward → accept → keep the accepted path.

A chain of drafts is a tree with one child per node, so every round runs the same steps: the
drafter proposes a chain or a tree, the target scores the root (the last emitted token) and every
node in one forward, the acceptance rule picks the path it keeps, and the cache and the drafter's
features keep exactly that path. Verify looks at the shape: a chain is fed causally, on the kernels
whose rows equal one-token forwards bit for bit (runtime/rowwise_attention.py), a tree under its
ancestor mask (tree.py). Accept does not: the target's token at each position is its argmax, or
under sampling the winner of a race under noise fixed by the seed and the position (coupling.py),
and a draft token is kept when it is that token. Only the opt-in lossy rules judge a chain on q.

It knows nothing of terminals or command lines. ``SpeculativeEngine.generate`` yields one
``RoundEvent`` per verify round; the live view, JSON output and statistics all consume those.
K = 0 is plain decoding through the very same loop, which is what makes the two comparable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from ..errors import PromptTooLong, UserError
from ..limits import MAX_K
from ..runtime.lean_forward import fallback_forwards
from .acceptance import AcceptRule, SamplingParams, distribution, greedy_accept, relaxed_accept
from .blocks import padded_chain, padded_tree
from .coupling import PositionNoise, race_scores
from .drafters.base import Draft, Drafter, Needs, TreeDrafting, Verified, drafts_trees, parts, top_ids
from .events import CONTEXT, EOS, MAX_NEW_TOKENS, RoundEvent
from .kv import context_length, input_device, keep_rows, reserved_cache
from .rules import check_tree_rule
from .schedule import FixedK, KSchedule, Take
from .tree import Tree, TreeShape, greedy_tree_accept, verify_tree

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.cache_utils import DynamicCache

    from ..runtime.reserved_cache import ReservedCache

__all__ = ["FixedK", "KSchedule", "RoundEvent", "SpeculativeEngine"]


@dataclass
class Request:
    """One answer in progress: what each of its rounds reads and moves on (gpt-fast keeps these as its
    loop's locals). ``tokens`` are the prompt and the answer so far; the cache holds all but the last."""

    schedule: KSchedule
    cache: object
    tokens: torch.Tensor
    prompt_length: int
    budget: int  # tokens the answer may add
    limit: str  # what ends it when no EOS does: MAX_NEW_TOKENS or CONTEXT
    device: object
    sampling: SamplingParams
    noise: PositionNoise | None  # the race's, under sampling
    generator: torch.Generator | None  # a lossy rule's draws
    rule: AcceptRule
    record_logits: bool
    fallbacks: int  # the target's fallback forwards counted so far, for each event's own
    produced: int = 0

    @property
    def left(self) -> int:
        return self.budget - self.produced


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
        self._free, self._learned = parts(drafter)
        self._extra = {"output_hidden_states": list(self.needs.features)} if self.needs.features else {}
        # Trees, decided once: the drafter's every draft is one (K its node budget), and the learned
        # drafter a schedule may ask for one (Take.TREE), where it drafts them.
        self.drafts_trees = drafts_trees(drafter)
        self._trees = self._learned if isinstance(self._learned, TreeDrafting) else None

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[int],
        *,
        k: int | KSchedule,
        max_new_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        seed: int = 0,
        record_logits: bool = False,
        rule: AcceptRule = AcceptRule(),
    ) -> Iterator[RoundEvent]:
        """``rule`` other than exact is a lossy acceptance rule (acceptance.py): opt-in, and every
        caller that passes one must say so in its output.

        Sampling is drafter-invariant (coupling.py): the answer's i-th token is fixed by ``seed``, i
        and the target's distribution there, so the same seed gives the same text at every K, with
        every drafter, and plainly. A lossy rule also draws from a generator seeded with ``seed``,
        whose draws depend on the drafts: its text is not invariant."""
        schedule = FixedK(k) if isinstance(k, int) else k
        budget = self._budget(prompt_ids, max_new_tokens, schedule, rule)
        device = input_device(self.target)
        tokens = torch.tensor(prompt_ids, dtype=torch.long)
        if self.drafter is not None:
            self.drafter.reset()
        fallbacks = fallback_forwards(self.target)  # the prompt's are the first event's
        cache, out = self.prompt_cache(tokens)
        if out is not None and self.drafter is not None:
            self.drafter.observe(Verified(tokens, len(prompt_ids), features=self._features(out, slice(0, len(prompt_ids) - 1))))
        request = Request(
            schedule, cache, tokens, len(prompt_ids), budget,
            limit=MAX_NEW_TOKENS if budget == max_new_tokens else CONTEXT, device=device, sampling=sampling,
            noise=None if sampling.greedy else PositionNoise(seed, self.vocab_size, len(prompt_ids)),
            generator=None if rule.lossless else torch.Generator(device=device).manual_seed(seed),
            rule=rule, record_logits=record_logits, fallbacks=fallbacks,
        )
        while request.left > 0:
            event = self._round(request)
            schedule.observe(event)
            yield event
            if event.finished:
                return

    def _round(self, request: Request) -> RoundEvent:
        """One round, in its steps: plan and draft (a chain or a tree), verify in one forward, accept,
        commit the kept path (cache and tokens), show the drafters what the target said, and the event."""
        started = time.perf_counter()
        cached = request.tokens.shape[0] - 1
        request.schedule.context(cached)
        want, draft, offer_s = self._draft(request)
        drafted_at = time.perf_counter()
        block = torch.cat([request.tokens[-1:], draft.tokens])  # block index 0 the root, i the i-th draft node
        tree = None if draft.parents is None else Tree(block, (-1, *draft.parents))  # None: a chain
        out = self._verify(request.cache, block, tree, cached, request.device)
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
            offer_s=offer_s,
            confidence=draft.confidence,
            k=want,
            drafted=draft.tokens.tolist(),
            accepted=min(len(path), len(emitted)),  # drafts past an EOS or the budget were not used
            token=token if complete else None,
            emitted=emitted,
            draft_s=drafted_at - started,
            verify_s=verified_at - drafted_at,
            finished=finished,
            logits=logits[rows_kept].cpu() if request.record_logits else None,
            stop=EOS if eos else (request.limit if finished else None),
            cached=cached,
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
        keep_rows(request.cache, request.tokens.shape[0] - 1, rows)
        request.tokens = torch.cat([request.tokens, torch.tensor(emitted, dtype=torch.long)])
        request.produced += len(emitted)
        return rows

    def _observe(self, request: Request, block, logits, out, rows_kept, finished: bool) -> None:
        """Show the drafter what the target said of the round: the context now, its successors and features."""
        if self.drafter is None:
            return
        successors = top_ids(logits.cpu(), self.needs.successors) if self.needs.successors else None
        self.drafter.observe(Verified(request.tokens, request.prompt_length, block, successors,
                                      self._features(out, rows_kept), finished))

    @torch.inference_mode()
    def prompt_cache(self, tokens: torch.Tensor) -> tuple[ReservedCache | DynamicCache, object]:
        """The target's cache of every prompt token but the last (the invariant of every round: the
        cache holds all tokens but the last emitted one), and the forward's output (None for a
        one-token prompt). Its only logits asked for are the last row's: a quantised target runs
        it as a prompt (runtime/dense_prefill.py), which a verify block, scoring every row, never is."""
        cache = reserved_cache(self.target.config)
        if tokens.shape[0] < 2:
            return cache, None
        out = self.target(tokens[None, :-1].to(input_device(self.target)), cache=cache, use_cache=True,
                          logits_to_keep=1, **self._extra)
        return cache, out

    def _budget(self, prompt_ids: list[int], max_new_tokens: int, schedule: KSchedule, rule: AcceptRule) -> int:
        """The tokens this run may add, once the request is found sound."""
        if self.drafts_trees or schedule.trees:
            check_tree_rule(rule)
        if schedule.trees and self.drafter is not None and self._trees is None:
            raise ValueError(f"the schedule may plan trees, and drafter {self.drafter.name!r} has no learned drafter "
                             "that drafts them (decoding/drafters/base.TreeDrafting)")
        if not prompt_ids:
            raise UserError("the prompt is empty")
        if not self.context_length:
            return max_new_tokens
        PromptTooLong.check(len(prompt_ids), self.context_length)
        return min(max_new_tokens, self.context_length - len(prompt_ids))

    def _draft(self, request: Request) -> tuple[int, Draft, float]:
        """The round's K and draft, as the schedule plans them: the drafter as it is, a free drafter's
        ready draft, the learned drafter (a chain, gated where the schedule says, or a tree), or none;
        and the seconds spent finding the free drafters' drafts, which every round pays."""
        # A round emits at most K + 1 tokens: drafting past the budget is wasted work.
        room = max(0, min(MAX_K, request.left - 1))
        started = time.perf_counter()
        offers = self._offers(request.tokens, room) if request.schedule.reads_offer and room else {}
        offer_s = time.perf_counter() - started
        want, draft = self._chosen(request.schedule, request.tokens, offers, room, request.sampling, request.noise)
        return want, draft, offer_s

    def _chosen(self, schedule: KSchedule, tokens, offers: dict[str, Draft], room: int, sampling,
                noise) -> tuple[int, Draft]:
        """The K and draft of the schedule's plan among the offers, the learned drafter and none."""
        learned = self._learned.name if self._learned is not None else None
        plan = schedule.plan({name: len(offer) for name, offer in offers.items()}, learned, room)
        tree = plan.take is Take.TREE or (plan.take is Take.AS_IS and self.drafts_trees)
        # A chain's K is its depth; a tree's is its node count, however shallow (paths past the budget are cut).
        want = max(0, min(plan.k, MAX_K if room else 0) if tree else min(plan.k, room))
        if plan.take is Take.NOTHING or want == 0 or self.drafter is None:
            return (0 if plan.take is Take.NOTHING else want), Draft.empty()
        if plan.take is Take.OFFER:
            offer = offers.get(plan.source)
            if offer is None or want > len(offer):
                raise ValueError(f"schedule took {want} tokens of {plan.source!r}'s offer; offered "
                                 + (", ".join(f"{name!r} ({len(o)} tokens)" for name, o in offers.items()) or "nothing"))
            return want, offer.first(want)
        if plan.take is Take.AS_IS:
            draft = self.drafter.propose(tokens, want, sampling, noise)
        elif self._learned is None:
            raise ValueError(f"schedule chose the learned drafter ({plan.take.value}); this drafter has none")
        elif plan.take is Take.LEARNED:
            gate = schedule.gate(plan.source, want)  # the drafter stops where its guesses stop paying (gate.py)
            draft = self._learned.propose(tokens, want, sampling, noise, gate=gate)
        elif self._trees is None:
            raise ValueError(f"schedule planned a tree; drafter {self._learned.name!r} drafts no trees")
        else:
            draft = self._trees.propose_tree(tokens, TreeShape(want))
        if draft.parents is None:
            return want, draft.first(want)
        if len(draft) > want:
            raise RuntimeError(f"drafter {self.drafter.name} proposed a tree of {len(draft)} nodes, {want} asked for")
        return want, draft

    def _offers(self, tokens: torch.Tensor, room: int) -> dict[str, Draft]:
        """Each free drafter's ready draft of at most ``room`` tokens, by its source (none where it has none)."""
        offers = {}
        for drafter in self._free:
            draft = drafter.propose(tokens, room, None, None)
            if len(draft):
                offers.setdefault(draft.source or drafter.name, draft)
        return offers

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
        node i, at its depth), chain or tree alike. A lossy rule judges a chain's drafts on p and q
        instead (acceptance.py)."""
        sampling, rule = request.sampling, request.rule
        scores = logits
        if not sampling.greedy and rule.lossless:  # a lossy rule judges p and q instead
            start = request.tokens.shape[0]
            depths = range(logits.shape[0]) if tree is None else tree.depths().tolist()
            scores = race_scores(distribution(logits, sampling), request.noise.rows(start + d for d in depths))
        if tree is not None:
            return greedy_tree_accept(tree, scores)
        drafts = draft.tokens.to(logits.device)
        if rule.lossless:
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
