"""The speculative loop: draft → verify in one target forward → accept/reject → roll the cache back.

It knows nothing of terminals or command lines. ``SpeculativeEngine.generate`` yields one
``RoundEvent`` per verify round; the live view, JSON output and statistics all consume those.
K = 0 is plain decoding through the very same loop, which is what makes the two comparable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from ..errors import UserError
from ..limits import MAX_K
from .acceptance import AcceptRule, SamplingParams, distribution, greedy_accept, relaxed_accept, speculative_accept
from .drafters import Draft, Drafter, parts
from .kv import crop_cache, input_device, keep_positions, reserved_cache
from .tree import Tree, TreeShape, greedy_tree_accept, tree_sample_accept, tree_source, verify_tree


@dataclass
class RoundEvent:
    """What one verify round did.

    ``drafted`` are the proposed ids, of which the first ``accepted`` passed the target's test;
    ``token`` is the one the target chose itself (correction after a rejection, or bonus after full
    acceptance), None when EOS or the token budget ended the block before it. ``emitted`` is what
    the round appended to the output.
    """

    k: int
    drafted: list[int]
    accepted: int
    token: int | None
    emitted: list[int]
    draft_s: float
    verify_s: float
    finished: bool
    logits: torch.Tensor | None = field(default=None, repr=False)  # raw target rows for `emitted`, on request
    source: str = ""  # the drafter that drafted (Draft.source); "" when none was asked (or none drafted ungated)
    other_s: float = 0.0  # the round's bookkeeping after verifying (cache crop, features, the schedule's own work)
    catchup_s: float = 0.0  # part of draft_s: a head catching up after rounds without it (paid once per gap)
    confidence: list[float] | None = None  # under a gate: the drafter's confidence per position weighed (Draft)
    # A tree round (tree.py): ``drafted`` are its nodes, ``parents`` their parents as block indices
    # (0 the root), ``accepted`` the length of the kept path, ``turned_down`` the children of the
    # path's last node, every one of which the target tested and refused. None for a chain.
    parents: tuple[int, ...] | None = None
    turned_down: list[int] | None = None
    path: list[int] | None = None  # a tree round's kept nodes, as block indices (1 the first draft node)

    @property
    def nodes(self) -> int:
        """Draft tokens the target verified in this round's one forward (a chain's K, a tree's size)."""
        return len(self.drafted)

    @property
    def rejected(self) -> list[int]:
        if self.parents is not None:
            return list(self.turned_down or [])
        return self.drafted[self.accepted :]

    @property
    def judged(self) -> int:
        """Drafts the target tested: the kept ones and the first turned down. The speed-up formula's
        α is kept / judged; kept / drafted would also count drafts after a rejection, never tested.
        In a tree: the path's nodes and the refused children at its end."""
        if self.parents is not None:
            return self.accepted + len(self.turned_down or [])
        return self.accepted + (self.accepted < len(self.drafted))


class KSchedule(Protocol):
    """Chooses K before each round and sees how the round went (a fixed K, or an adaptive controller).

    A schedule may also have ``plan(offer, offer_source, learned, room) -> (k, source)``: it is then
    shown prompt lookup's match first (``offer`` tokens long, 0 for none; free to find) and picks the
    round's drafter itself: the match (its first k tokens), the learned drafter (k tokens), or nothing;
    or, naming ``tree_source(learned)``, the learned drafter's tree of at most k nodes (a head's).
    Each round's draft still comes whole from one drafter, with its q, so acceptance is unchanged.
    """

    def choose(self) -> int: ...

    def observe(self, event: RoundEvent) -> None: ...


@dataclass
class FixedK:
    k: int

    def choose(self) -> int:
        return self.k

    def observe(self, event: RoundEvent) -> None:
        pass


class SpeculativeEngine:
    def __init__(
        self, target: PreTrainedModel, drafter: Drafter | None, eos_token_ids: set[int], block_plan: dict[int, int] | None = None
    ):
        self.target = target
        self.block_plan = block_plan or {}  # verify-block length → the cheaper length to run it at (blocks.py)
        self.drafter = drafter
        self.eos_token_ids = set(eos_token_ids)
        self.vocab_size = target.config.get_text_config().vocab_size
        self.context_length = getattr(target.config.get_text_config(), "max_position_embeddings", None)
        # Only a drafter that reads the target's features gets them (the hidden states it names in
        # feature_layers, by default the last one, post-norm): plain decoding and the other drafters pay nothing.
        self.wants_features = bool(getattr(drafter, "uses_target_features", False))
        self._offer, self._learned = parts(drafter)
        self.feature_layers = tuple(getattr(self._learned, "feature_layers", None) or (-1,))
        self._extra = {"output_hidden_states": list(self.feature_layers)} if self.wants_features else {}
        self.drafts_trees = bool(getattr(drafter, "drafts_trees", False))

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
        caller that passes one must say so in its output."""
        schedule = FixedK(k) if isinstance(k, int) else k
        if (self.drafts_trees or getattr(schedule, "trees", False)) and not rule.lossless:
            raise UserError(f"acceptance rule {rule} applies to chains of drafts; trees are verified exactly")
        if not prompt_ids:
            raise UserError("the prompt is empty")
        budget = max_new_tokens
        if self.context_length:
            if len(prompt_ids) >= self.context_length:
                raise UserError(
                    f"the prompt is {len(prompt_ids)} tokens; the target's context holds {self.context_length}"
                )
            budget = min(budget, self.context_length - len(prompt_ids))

        device = input_device(self.target)
        generator = torch.Generator(device=device).manual_seed(seed)
        tokens = torch.tensor(prompt_ids, dtype=torch.long)
        if self.drafter is not None:
            self.drafter.reset()
        cache, out = self.prompt_cache(tokens)
        if out is not None:
            self._hand_features(out, len(prompt_ids) - 1)

        produced = 0
        while produced < budget:
            # A round emits at most k + 1 tokens; drafting past the budget is wasted work.
            room = max(0, min(MAX_K, self._room(budget - produced)))
            started = time.perf_counter()
            if hasattr(schedule, "plan") and self.drafter is not None:
                want, draft = self._planned(schedule, tokens, room, sampling, generator)
            else:
                want = max(0, min(schedule.choose(), room))
                draft = self._draft(tokens, want, sampling, generator)
            drafted_at = time.perf_counter()
            if draft.parents is not None:  # a tree: verified in one forward, its best path kept (tree.py)
                event = self._tree_round(cache, tokens, draft, want, budget - produced, sampling, generator,
                                         drafted_at - started, record_logits)
                produced += len(event.emitted)
                tokens = torch.cat([tokens, torch.tensor(event.emitted, dtype=torch.long)])
                schedule.observe(event)
                yield event
                if event.finished:
                    return
                continue

            block = self._padded(torch.cat([tokens[-1:], draft.tokens]), tokens.shape[0] - 1)
            out = self.target(block[None].to(device), cache=cache, use_cache=True, logits_to_keep=block.shape[0], **self._extra)
            logits = out.logits[0, : len(draft) + 1, : self.vocab_size].float()
            if not rule.lossless:
                accepted, token = relaxed_accept(rule, draft.tokens.to(logits.device), draft.probs, logits, sampling, generator)
            elif sampling.greedy:
                accepted, token = greedy_accept(draft.tokens.to(logits.device), logits)
            else:
                accepted, token = speculative_accept(
                    draft.tokens.to(logits.device), draft.probs, distribution(logits, sampling), generator
                )
            verified_at = time.perf_counter()

            emitted, finished = self._cut(draft.tokens[:accepted].tolist() + [token], budget - produced)
            produced += len(emitted)
            tokens = torch.cat([tokens, torch.tensor(emitted, dtype=torch.long)])
            crop_cache(cache, tokens.shape[0] - 1)
            self._hand_features(out, len(emitted))  # the block's first len(emitted) positions stay cached
            event = RoundEvent(
                source=draft.source if len(draft) or draft.confidence else "",
                catchup_s=draft.catchup_s,
                confidence=draft.confidence,
                k=want,
                drafted=draft.tokens.tolist(),
                accepted=min(accepted, len(emitted)),  # drafts past an EOS or the budget were not used
                token=token if len(emitted) == accepted + 1 else None,
                emitted=emitted,
                draft_s=drafted_at - started,
                verify_s=verified_at - drafted_at,
                finished=finished or produced >= budget,
                logits=logits[: len(emitted)].cpu() if record_logits else None,
            )
            event.other_s = time.perf_counter() - verified_at  # before observe: the schedule's work is its own
            schedule.observe(event)
            yield event
            if event.finished:
                return

    @torch.inference_mode()
    def prompt_cache(self, tokens: torch.Tensor) -> tuple[DynamicCache, object]:
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

    def _room(self, left: int) -> int:
        """The most drafts worth asking for with ``left`` tokens to go: a chain's K is its depth, so
        left − 1; a tree's is its node count, however shallow (paths past the budget are cut)."""
        if self.drafts_trees:
            return MAX_K if left > 1 else 0
        return left - 1

    def _hand_features(self, out, rows: int | list[int]) -> None:
        """The target's features of the positions that stay cached: the first ``rows``, or those listed."""
        if self.wants_features:
            chosen = slice(0, rows) if isinstance(rows, int) else rows
            self.drafter.add_features(torch.cat([out.hidden_states[i][0][chosen] for i in self.feature_layers], dim=-1))

    def _tree_round(self, cache, tokens, draft: Draft, want: int, room: int, sampling, generator, draft_s: float,
                    record_logits: bool) -> RoundEvent:
        """One tree round: the root and every node in one target forward, the accepted path kept.

        Acceptance is greedy, or the point-mass rule for deterministic candidates (tree.py); the
        cache and the head's features keep exactly the root and the accepted nodes, in path order.
        """
        started = time.perf_counter()
        cached = tokens.shape[0] - 1
        tree = Tree(torch.cat([tokens[-1:], draft.tokens]), (-1, *draft.parents))
        out = verify_tree(self.target, cache, self._padded_tree(tree, cached), input_device(self.target), **self._extra)
        logits = out.logits[0, : len(tree), : self.vocab_size].float()
        if sampling.greedy:
            path, token = greedy_tree_accept(tree, logits)
        else:
            path, token = tree_sample_accept(tree, distribution(logits, sampling), generator)
        verified_at = time.perf_counter()

        emitted, finished = self._cut([int(tree.tokens[node]) for node in path] + [token], room)
        rows = [0, *path][: len(emitted)]  # block positions that stay cached: the root and the kept nodes
        keep_positions(cache, torch.cat([torch.arange(cached), cached + torch.tensor(rows, dtype=torch.long)]))
        self._hand_features(out, rows)
        complete = len(emitted) == len(path) + 1  # neither EOS nor the budget cut the path short
        return RoundEvent(
            source=draft.source,
            catchup_s=draft.catchup_s,
            k=want,
            drafted=draft.tokens.tolist(),
            accepted=min(len(path), len(emitted)),
            token=token if complete else None,
            emitted=emitted,
            draft_s=draft_s,
            verify_s=verified_at - started,
            finished=finished or len(emitted) >= room,
            logits=logits[rows].cpu() if record_logits else None,
            parents=tuple(draft.parents),
            turned_down=[int(tree.tokens[c]) for c in tree.children(rows[-1])] if complete else [],
            path=rows[1:],
        )

    def _padded_tree(self, tree: Tree, cached: int) -> Tree:
        """The tree, with copies of the root hung under it where a longer forward is cheaper.

        No real node sees them (the mask shows a node only its ancestors), acceptance reads the real
        nodes alone, and their cache entries are dropped with the rest of the unaccepted tree.
        """
        length = self.block_plan.get(len(tree), len(tree))
        if self.context_length:
            length = min(length, self.context_length - cached)
        if length <= len(tree):
            return tree
        extra = length - len(tree)
        return Tree(torch.cat([tree.tokens, tree.tokens[:1].expand(extra)]), tree.parents + (0,) * extra)

    def _padded(self, block: torch.Tensor, cached: int) -> torch.Tensor:
        """The block, lengthened with copies of its last token where a longer forward is cheaper.

        The padding sits after every real position, so causal attention keeps it out of their
        logits; its cache entries are cropped with the rejected drafts.
        """
        length = self.block_plan.get(block.shape[0], block.shape[0])
        if self.context_length:
            length = min(length, self.context_length - cached)
        if length <= block.shape[0]:
            return block
        return torch.cat([block, block[-1:].expand(length - block.shape[0])])

    def _planned(self, schedule, tokens, room, sampling, generator) -> tuple[int, Draft]:
        """The schedule picks the round's drafter: lookup's match, the learned drafter, or none."""
        offer = self._offer(tokens, room) if self._offer is not None and room else Draft.empty()
        learned = self._learned.name if self._learned is not None else None
        want, source = schedule.plan(len(offer), offer.source or None, learned, room)
        tree = learned is not None and source == tree_source(learned)
        # A tree's budget is its node count, however shallow (paths past the token budget are cut).
        want = max(0, min(want, MAX_K if room else 0) if tree else min(want, room))
        if want == 0 or source is None:
            return 0, Draft.empty()
        if source == offer.source and want <= len(offer):
            return want, Draft(offer.tokens[:want], None, offer.source)
        if tree and hasattr(self._learned, "propose_tree"):
            return want, self._learned.propose_tree(tokens, TreeShape(want))  # verified as a tree: _tree_round
        if source != learned:
            raise ValueError(f"schedule chose drafter {source!r} for {want} tokens; offered {offer.source!r} "
                             f"({len(offer)} tokens) and {learned!r}")
        # A schedule may gate the draft: the drafter stops where its guesses stop paying (gate.py).
        gate = schedule.gate(source, want) if hasattr(schedule, "gate") else None
        draft = self._learned.propose(tokens, want, sampling, generator, **({"gate": gate} if gate else {}))
        return want, Draft(draft.tokens[:want], None if draft.probs is None else draft.probs[:want], draft.source,
                           draft.catchup_s, confidence=draft.confidence)

    def _draft(self, tokens, want, sampling, generator) -> Draft:
        if want == 0 or self.drafter is None:
            return Draft.empty()
        draft = self.drafter.propose(tokens, want, sampling, generator)
        if draft.parents is not None:
            if len(draft) > want:
                raise RuntimeError(f"drafter {self.drafter.name} proposed a tree of {len(draft)} nodes, {want} asked for")
            return draft
        return Draft(draft.tokens[:want], None if draft.probs is None else draft.probs[:want], draft.source, draft.catchup_s)

    def _cut(self, emitted: list[int], room: int) -> tuple[list[int], bool]:
        """Honour EOS and the token budget inside a block."""
        for i, token in enumerate(emitted[:room]):
            if token in self.eos_token_ids:
                return emitted[: i + 1], True
        return emitted[:room], False
