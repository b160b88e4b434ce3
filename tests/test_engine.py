"""The speculative loop on tiny random models: exact token identity with plain decoding."""

import pytest
import torch
from conftest import PROMPT, decode
from exactness import PROMPT as SMALL_PROMPT
from exactness import VOCAB, assert_lossless, small_models
from transformers import DynamicCache

from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.drafters.lookup import NgramDrafter, lookup_source
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.engine import RoundEvent
from specdec_cli.decoding.kv import crop_cache



@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("kind", ["random", "similar", "self", "ngram"])
def test_greedy_speculation_is_token_identical_to_plain_decoding(target, draft, similar, plain, kind, k):
    drafter = {
        "random": lambda: ModelDrafter(draft, target.config.vocab_size),
        "similar": lambda: ModelDrafter(similar, target.config.vocab_size),
        "self": lambda: ModelDrafter(target, target.config.vocab_size),
        "ngram": lambda: NgramDrafter(),
    }[kind]()
    tokens, events = decode(target, drafter, k)
    assert tokens == plain
    drafted = sum(len(e.drafted) for e in events)
    accepted = sum(e.accepted for e in events)
    if kind == "self":  # draft = target: every draft is accepted
        assert accepted == drafted > 0
        assert len(events) < len(plain)


def test_similar_draft_is_partly_accepted_so_rollback_is_exercised(target, similar):
    _, events = decode(target, ModelDrafter(similar, target.config.vocab_size), 4)
    rate = sum(e.accepted for e in events) / sum(len(e.drafted) for e in events)
    assert 0.2 < rate < 0.95
    assert any(0 < e.accepted < len(e.drafted) for e in events)


def test_k0_is_plain_decoding_one_token_per_round(target, plain):
    tokens, events = decode(target, NgramDrafter(), 0)
    assert tokens == plain and len(events) == len(plain)
    assert all(e.drafted == [] and len(e.emitted) == 1 for e in events)


def test_max_new_tokens_inside_a_block(target, plain):
    tokens, events = decode(target, ModelDrafter(target, target.config.vocab_size), 8, max_new_tokens=5)
    assert tokens == plain[:5]
    assert events[-1].finished
    assert len(events) == 1  # K is cut to the budget: one round of 4 drafts + 1 target token


def test_eos_inside_a_block_ends_generation_at_eos(target, plain):
    eos = plain[6]
    first = plain.index(eos)
    expected = plain[: first + 1]
    tokens, events = decode(target, ModelDrafter(target, target.config.vocab_size), 8, eos=(eos,))
    assert tokens == expected
    assert events[-1].finished and events[-1].emitted[-1] == eos
    assert all(e.accepted <= len(e.emitted) for e in events)  # drafts after EOS are not counted as accepted
    assert decode(target, None, 0, eos=(eos,))[0] == expected


def test_crop_cache_drops_only_the_rejected_positions():
    cache = DynamicCache()
    keys = torch.arange(2 * 7 * 3, dtype=torch.float).view(1, 2, 7, 3)
    cache.update(keys, keys.clone(), 0)
    crop_cache(cache, 4)
    assert cache.get_seq_length() == 4
    assert torch.equal(cache.layers[0].keys, keys[:, :, :4])
    crop_cache(cache, 9)  # longer than the cache: nothing to drop
    assert cache.get_seq_length() == 4


def test_model_drafter_cache_follows_the_accepted_prefix(target):
    drafter = ModelDrafter(target, target.config.vocab_size)
    context = torch.tensor(PROMPT)
    first = drafter.propose(context, 4, SamplingParams(), None)
    # Two drafts accepted plus a correction that differs from the third draft.
    correction = (int(first.tokens[2]) + 1) % 98
    longer = torch.cat([context, first.tokens[:2], torch.tensor([correction])])
    again = drafter.propose(longer, 3, SamplingParams(), None)
    assert drafter.cache.get_seq_length() == len(longer) + 2
    fresh = ModelDrafter(target, target.config.vocab_size).propose(longer, 3, SamplingParams(), None)
    assert torch.equal(again.tokens, fresh.tokens)


def test_ngram_drafter_proposes_what_followed_the_latest_match():
    drafter = NgramDrafter(max_ngram=2)
    context = torch.tensor([1, 2, 3, 9, 1, 2, 4, 5, 6, 1, 2])
    assert drafter.propose(context, 3, SamplingParams(), None).tokens.tolist() == [4, 5, 6]
    assert drafter.propose(context, 10, SamplingParams(), None).tokens.tolist() == [4, 5, 6, 1, 2]
    assert drafter.propose(torch.tensor([7, 8, 9]), 3, SamplingParams(), None).tokens.tolist() == []
    assert drafter.propose(torch.tensor([3, 7, 3]), 2, SamplingParams(), None).tokens.tolist() == [7, 3]


def scanned_lookup(context: list[int], k: int, max_ngram: int, min_ngram: int) -> tuple[list[int], int]:
    """Prompt lookup by scanning the whole context: (what followed the latest match, its length)."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        starts = [i for i in range(len(context) - n) if context[i : i + n] == context[-n:]]
        if starts:
            return context[starts[-1] + n : starts[-1] + n + k], n
    return [], 0


@pytest.mark.parametrize("min_ngram", [1, 2])
def test_the_growing_lookup_index_finds_what_a_scan_of_the_whole_context_finds(min_ngram):
    """Contexts grow by a round's tokens, and switch to other prompts without a reset (shorter, a
    continuation, or longer but different): the index must answer every call as a fresh scan would."""
    generator = torch.Generator().manual_seed(0)
    drafter = NgramDrafter(max_ngram=3, min_ngram=min_ngram)
    calls, previous = 0, torch.empty(0, dtype=torch.long)
    for prompt in range(12):
        context = torch.randint(0, 4 + prompt % 3, (int(torch.randint(1, 9, (1,), generator=generator)),), generator=generator)
        if prompt % 4 == 1:
            context = torch.cat([previous, context])  # the last context, continued
        elif prompt % 4 == 3:
            context = torch.cat([previous, context])
            context[len(previous) // 2] += 1  # longer than the last one, and not its continuation
        for _ in range(25):
            k = int(torch.randint(1, 6, (1,), generator=generator))
            draft = drafter.propose(context, k, SamplingParams(), None)
            expected, n = scanned_lookup(context.tolist(), k, 3, min_ngram)
            assert draft.tokens.tolist() == expected
            assert draft.source == (lookup_source(n) if n else "")
            calls += 1
            grown = torch.randint(0, 4 + prompt % 3, (int(torch.randint(1, 5, (1,), generator=generator)),), generator=generator)
            context = torch.cat([context, grown])
        previous = context
    assert calls == 300


def test_a_lookup_draft_is_named_for_the_length_of_its_match():
    """The adaptive controller keeps an estimate per name: a longer match is stronger evidence."""
    drafter = NgramDrafter(max_ngram=3)
    sources = {context: drafter.propose(torch.tensor(context), 2, SamplingParams(), None).source
               for context in ((5, 6, 1, 2, 3, 7, 1, 2, 3), (5, 6, 1, 2, 8, 7, 1, 2), (5, 6, 1, 8, 7, 1), (1, 2, 3, 4))}
    assert list(sources.values()) == ["lookup", "lookup-2", "lookup-1", ""]


def test_prompt_longer_than_context_is_a_user_error(target):
    from specdec_cli.errors import UserError

    with pytest.raises(UserError, match="context holds 256"):
        decode(target, None, 0, prompt=[5] * 256)


# --- sampling: a seed fixes the text, whatever drafts (decoding/coupling.py) ---------------------

SAMPLINGS = [SamplingParams(0.8), SamplingParams(0.7, top_k=5), SamplingParams(1.0, top_p=0.9)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t0.8", "top-k", "top-p"])
def test_sampled_text_is_fixed_by_the_seed_at_every_k_and_drafter(target, similar, sampling):
    drafters = {"similar": lambda: ModelDrafter(similar, target.config.vocab_size), "ngram": NgramDrafter,
                "self": lambda: ModelDrafter(target, target.config.vocab_size)}
    for seed in range(3):
        plain, _ = decode(target, None, 0, sampling=sampling, seed=seed)
        again, _ = decode(target, None, 0, sampling=sampling, seed=seed)
        assert plain == again and plain != decode(target, None, 0, sampling=sampling, seed=seed + 100)[0]
        for name, drafter in drafters.items():
            for k in (1, 3, 6):
                tokens, events = decode(target, drafter(), k, sampling=sampling, seed=seed)
                assert tokens == plain, (name, k, seed)
                assert sum(e.accepted for e in events) > 0 or name == "ngram"


def test_a_sampler_that_keeps_drafts_without_the_test_changes_the_text(target, similar, monkeypatch):
    """The identity above can fail: keep every draft token without asking the race, and the text moves."""
    from specdec_cli.decoding import engine as engine_module

    monkeypatch.setattr(engine_module, "greedy_accept", lambda draft, scores: (len(draft), int(scores[len(draft)].argmax())))
    plain, _ = decode(target, None, 0, sampling=SAMPLINGS[0], seed=0)
    assert decode(target, ModelDrafter(similar, target.config.vocab_size), 3, sampling=SAMPLINGS[0], seed=0)[0] != plain


# --- sampling: the speculative distribution equals the target's, exactly -------------------------

REPEATING = [3, 4, 5, 6, 3, 4]  # lookup finds [3, 4] and drafts the 5 that followed


@pytest.fixture(scope="module")
def small():
    return small_models()


@pytest.mark.slow
@pytest.mark.parametrize(
    "drafter_kind, sampling",
    [("self", SamplingParams(1.0)), ("disagreeing", SamplingParams(1.0)), ("disagreeing", SamplingParams(0.7, top_k=5)),
     ("ngram", SamplingParams(1.0))],
)
def test_speculative_sampling_matches_the_targets_exact_distribution(small, drafter_kind, sampling):
    target, disagreeing = small
    drafter = {"self": ModelDrafter(target, VOCAB), "disagreeing": ModelDrafter(disagreeing, VOCAB),
               "ngram": NgramDrafter()}[drafter_kind]
    # lookup drafts only where the context repeats: its last two tokens occurred before
    assert_lossless(target, drafter, sampling, prompt=REPEATING if drafter_kind == "ngram" else SMALL_PROMPT)


def test_judged_counts_kept_drafts_and_the_first_rejected_one():
    def event(drafted, accepted):
        return RoundEvent(k=len(drafted), drafted=drafted, accepted=accepted, token=0, emitted=[], draft_s=0.0,
                          verify_s=0.0, finished=False)

    assert [event([5, 6, 7, 8], 1).judged, event([5, 6, 7, 8], 4).judged, event([], 0).judged] == [2, 4, 0]
