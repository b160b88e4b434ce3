"""The draft head's training recipe (training-time test unroll, fused features) and its file format."""

import pytest
import torch
from conftest import tiny_llama
from exactness import assert_lossless, small_models

from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.drafters.base import Verified
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.drafters.head import HeadDrafter, load_head
from specdec_cli.decoding.head_files import save_head, target_identity
from specdec_cli.decoding.head_network import DraftHead, head_config
from specdec_cli.errors import UserError
from specdec_cli.pairs.meta import read_meta, write_meta
from specdec_cli.training.distill import Example, collate
from specdec_cli.training.loop import Budget, HeadStudent, Trainer, learning_rate, unroll_mask

TOKENS = [0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
START = 4  # the answer starts here: teacher rows for positions 3..10


def features(target, tokens, layers):
    with torch.no_grad():
        out = target(torch.tensor([tokens]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)


def example(target, layers):
    rows = len(TOKENS) - START
    return Example(torch.tensor(TOKENS), START, torch.zeros(rows, 4, dtype=torch.long), torch.zeros(rows, 4),
                   features(target, TOKENS, layers))


def drafted_logits(head, target, layers, anchor, steps):
    """What the head computes at inference: true features up to the anchor, then its own guesses
    for ``steps`` more positions (fed the true next tokens, as when its drafts are right)."""
    drafter = HeadDrafter(head, target)
    drafter.reset()
    drafter.observe(Verified(torch.tensor(TOKENS[: anchor + 1]), anchor + 1,
                             features=features(target, TOKENS, layers)[:anchor]))
    with torch.no_grad():
        guess, _ = drafter._catch_up(torch.tensor(TOKENS[: anchor + 1]))
        logits = [drafter._logits(guess)]
        for step in range(1, steps):
            guess = drafter._step(torch.tensor([TOKENS[anchor + step]]), guess.view(1, -1), anchor + step, fuse=False)
            logits.append(drafter._logits(guess))
    return logits


@pytest.mark.parametrize("layers", [(-1,), (0, 1, -1)])
def test_the_unroll_computes_what_the_drafting_head_computes(target, layers):
    """Step a of the training unroll at the teacher row of position p equals the head drafting its
    (a+1)-th token from anchor p - a: true features in the context, its own guess only at the newest
    position. The old unroll fed guesses to every context position, which inference never does."""
    torch.manual_seed(4)
    head = DraftHead(head_config(target), layers)
    student = HeadStudent(head, target, None, unroll=3, noise=0.0)
    batch = collate([example(target, layers)], pad=0)
    with torch.no_grad():
        outputs = student.logits(batch)  # training mode: every unrolled step
    assert len(outputs) == 3
    positions = batch.where[1]
    for step, output in enumerate(outputs):
        reached = output[3] if len(output) == 4 else torch.ones_like(positions, dtype=torch.bool)
        for row, p in enumerate(positions[reached].tolist()):
            if p - step < 1:
                continue
            expected = drafted_logits(head, target, layers, p - step, step + 1)[step]
            assert torch.allclose(output[0][row], expected, atol=1e-4), (step, p)


def test_gradients_flow_through_the_unroll(target):
    torch.manual_seed(4)
    head = DraftHead(head_config(target))
    student = HeadStudent(head, target, None, unroll=2, noise=0.0)
    batch = collate([example(target, (-1,))], pad=0)
    logits, _, weight, _ = student.logits(batch)[1]
    assert weight == pytest.approx(0.8)
    # the step-1 guess of the newest position feeds step 2: its loss reaches the fc through it
    logits.sum().backward()
    assert head.fc.weight.grad is not None and head.fc.weight.grad.abs().sum() > 0


def test_unroll_mask_shows_each_anchor_its_true_context_and_its_own_chain():
    mask = unroll_mask(3, 2)
    assert mask.int().tolist() == [[1, 0, 0, 1, 0, 0, 1, 0, 0],
                                   [1, 1, 0, 0, 1, 0, 0, 1, 0],
                                   [1, 1, 1, 0, 0, 1, 0, 0, 1]]


# --- the fused-feature head: engine hand-over, file format, losslessness ------------------------

FUSED = (0, 1, -1)


def test_engine_hands_a_fused_head_the_hidden_states_it_names(target):
    torch.manual_seed(5)
    drafter = HeadDrafter(DraftHead(head_config(target), FUSED), target)
    prompt = [0, 5, 6, 7, 8, 5, 6]
    events = list(SpeculativeEngine(target, drafter, {1}).generate(prompt, k=3, max_new_tokens=12))
    tokens = prompt + [t for e in events for t in e.emitted]
    expected = features(target, tokens[:-1], FUSED)
    assert drafter.features.shape == expected.shape and drafter.features.shape[1] == 3 * target.config.hidden_size
    assert torch.allclose(drafter.features, expected, atol=1e-4)


def test_fused_head_round_trips_and_is_refused_by_another_target(target, tmp_path):
    torch.manual_seed(6)
    head = DraftHead(head_config(target), FUSED)
    save_head(tmp_path, head, {"target": target_identity(target, "tiny"), "layer": head.config_dict})
    meta = read_meta(tmp_path)
    assert meta["format"] == 2 and meta["feature_layers"] == list(FUSED)
    loaded = load_head(tmp_path, target, "tiny")
    assert loaded.needs.features == FUSED and torch.equal(loaded.head.fuse.weight, head.fuse.weight)
    prompt = [0, 5, 6, 7, 8]
    original = HeadDrafter(head, target)
    runs = [[t for e in SpeculativeEngine(target, d, {1}).generate(prompt, k=3, max_new_tokens=10) for t in e.drafted]
            for d in (original, loaded)]
    assert runs[0] == runs[1] and runs[0]
    with pytest.raises(UserError, match="was trained for target tiny"):
        load_head(tmp_path, tiny_llama(seed=7), "other")


def test_loading_a_head_reads_the_targets_output_table_once(target, tmp_path, monkeypatch):
    """A quantised target's output table is de-quantised whole to be read: the check of the head's
    target and the head's output rows share one read, and the check's fingerprint is unchanged."""
    import specdec_cli.decoding.drafters.head as head_module
    import specdec_cli.decoding.head_files as head_files

    torch.manual_seed(9)
    head = DraftHead(head_config(target), FUSED)
    identity = target_identity(target, "tiny")
    save_head(tmp_path, head, {"target": identity, "layer": head.config_dict})
    reads = []

    def counted(model):
        reads.append(model)
        return output_weight(model)

    output_weight = head_files.output_weight
    monkeypatch.setattr(head_files, "output_weight", counted)
    monkeypatch.setattr(head_module, "output_weight", counted)
    load_head(tmp_path, target, "tiny")
    assert reads == [target]
    assert target_identity(target, "tiny", output_weight(target)) == identity


def test_a_format_1_head_reads_the_last_hidden_state(target, tmp_path):
    """Heads saved before fused features (no format, no feature_layers in their meta) still load."""
    torch.manual_seed(6)
    head = DraftHead(head_config(target))
    save_head(tmp_path, head, {"target": target_identity(target, "tiny"), "layer": head.config_dict})
    meta = read_meta(tmp_path)
    del meta["format"], meta["feature_layers"]
    write_meta(tmp_path, meta)
    loaded = load_head(tmp_path, target, "tiny")
    assert loaded.needs.features == (-1,) and loaded.head.fuse is None
    meta["format"] = 3
    write_meta(tmp_path, meta)
    with pytest.raises(UserError, match="newer than this specdec reads"):
        load_head(tmp_path, target, "tiny")


def test_greedy_output_with_a_fused_head_is_the_targets(target):
    torch.manual_seed(8)
    for prompt in ([0, 5, 6, 7, 8, 5, 6], [0, 40, 41, 42]):
        plain = [t for e in SpeculativeEngine(target, None, {1}).generate(prompt, k=0, max_new_tokens=30) for t in e.emitted]
        for k in (1, 3, 4):
            drafter = HeadDrafter(DraftHead(head_config(target), FUSED), target)
            assert [t for e in SpeculativeEngine(target, drafter, {1}).generate(prompt, k=k, max_new_tokens=30)
                    for t in e.emitted] == plain


@pytest.mark.slow
def test_sampling_with_a_fused_head_keeps_the_targets_distribution():
    small, _ = small_models()
    torch.manual_seed(0)
    drafter = HeadDrafter(DraftHead(head_config(small), (0, 1, -1)), small, allowed=torch.tensor([0, 2, 3, 6]))
    assert_lossless(small, drafter, SamplingParams(1.0))


# --- answers with finished rows dropped --------------------------------------------------------


def test_pruned_answers_are_each_prompts_own_greedy_continuation(target):
    from specdec_cli.training.distill import AnswerSettings, answer_pruned

    prompts = [[0, 5, 6, 7, 8, 5, 6], [0, 40, 41], [0, 9, 9, 9, 9, 9, 9, 9, 9, 10]]

    def alone(prompt, eos):
        return [t for e in SpeculativeEngine(target, None, eos).generate(prompt, k=0, max_new_tokens=12) for t in e.emitted]

    eos = {1, alone(prompts[0], {1})[3]}  # the first prompt ends early: its row leaves the batch mid-way
    got = answer_pruned(target, prompts, eos=eos, pad=0, sampled=False, settings=AnswerSettings(max_new_tokens=12))
    assert len(got[0]) <= 4 and max(map(len, got)) > len(got[0])
    assert got == [alone(p, eos) for p in prompts]


def test_within_budget_stops_before_a_piece_that_would_overrun_and_shards_round_trip(tmp_path, capsys):
    import time

    from specdec_cli.training.corpus import read_shard, read_shards, shard_path, within_budget, write_shard

    assert list(within_budget(range(5), minutes=10)) == [0, 1, 2, 3, 4]
    done = []
    for item in within_budget(range(5), minutes=0.06 / 60):  # 60 ms; each piece takes 50 ms
        done.append(item)
        time.sleep(0.05)
    assert done == [0]  # 50 ms spent + 1.2 × 50 ms for the next > 60 ms
    assert "budget spent" in capsys.readouterr().out
    rows = [{"id": "a", "kind": "greedy", "ids": [1, 2, 3], "start": 1}]
    write_shard(shard_path(tmp_path, 0), rows)
    write_shard(shard_path(tmp_path, 1), rows[::-1])
    assert read_shard(shard_path(tmp_path, 0)) == rows
    assert read_shards(tmp_path) == rows + rows


def test_first_turns_are_finished_greedy_answers_to_known_prompts_and_conversations_encode_in_order():
    from specdec_cli.errors import UserError
    from specdec_cli.pairs.tokenization import encode_conversation
    from specdec_cli.training.corpus import finished_turns
    from tests.conftest import char_tokenizer

    rows = [{"id": "gen-1", "kind": "greedy", "ids": [5, 6, 7, 1], "start": 2},
            {"id": "gen-1", "kind": "sampled", "ids": [5, 6, 8, 1], "start": 2},  # sampled: not a first turn
            {"id": "gen-2", "kind": "greedy", "ids": [5, 6, 7, 9], "start": 2},  # cut off, no end of sequence
            {"id": "tpl-3", "kind": "greedy", "ids": [5, 6, 1], "start": 2},  # not among the ids asked for
            {"id": "gen-4", "kind": "greedy", "ids": [5] * 9 + [1], "start": 2}]  # longer than allowed
    assert finished_turns(rows, {"gen-1", "gen-2", "gen-4"}, eos=1, longest=8) == rows[:1]

    tokenizer = char_tokenizer()
    messages = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]
    with pytest.raises(UserError, match="chat template"):
        encode_conversation(tokenizer, messages)
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}" \
                              "{% if add_generation_prompt %}a:{% endif %}"
    assert tokenizer.decode(encode_conversation(tokenizer, messages)) == "u:ab;a:c;u:d;a:"


# --- the head at a quantised target's precision -------------------------------------------------


@pytest.mark.cpu_kernels
def test_a_quantised_targets_head_runs_int8_without_touching_the_float_head_and_stays_lossless():
    from specdec_cli.runtime.quantize import Int8Linear, quantise_model

    target = quantise_model(tiny_llama(seed=3), "int8")
    torch.manual_seed(8)
    head = DraftHead(head_config(target), FUSED)
    drafter = HeadDrafter(head, target, precision="int4")
    assert drafter.precision == "int8"
    assert not any(isinstance(m, torch.nn.Linear) for m in drafter.head.modules())
    assert any(isinstance(m, Int8Linear) for m in drafter.head.modules())
    assert isinstance(head.fc, torch.nn.Linear)  # the head it was given is another's to keep
    assert HeadDrafter(head, target).precision == "float32"
    for prompt in ([0, 5, 6, 7, 8, 5, 6], [0, 40, 41, 42]):
        plain = [t for e in SpeculativeEngine(target, None, {1}).generate(prompt, k=0, max_new_tokens=30) for t in e.emitted]
        for k in (1, 3):
            engine = SpeculativeEngine(target, HeadDrafter(head, target, precision="int8"), {1})
            assert [t for e in engine.generate(prompt, k=k, max_new_tokens=30) for t in e.emitted] == plain


@pytest.mark.slow
@pytest.mark.cpu_kernels
def test_sampling_with_an_int8_head_keeps_the_targets_distribution():
    small, _ = small_models()
    torch.manual_seed(0)
    drafter = HeadDrafter(DraftHead(head_config(small)), small, precision="int8")
    assert_lossless(small, drafter, SamplingParams(1.0))


@pytest.mark.cpu_kernels
def test_the_quantised_heads_lean_layer_computes_what_its_transformers_layer_does():
    from specdec_cli.runtime.quantize import quantise_model

    target = quantise_model(tiny_llama(seed=3), "int8")
    torch.manual_seed(8)
    head = DraftHead(head_config(target), FUSED)
    lean, dispatched = HeadDrafter(head, target, precision="int8"), HeadDrafter(head, target, precision="int8")
    dispatched.head.lean = None
    assert lean.head.lean is not None
    guesses = {}
    for name, drafter in (("lean", lean), ("dispatched", dispatched)):
        engine = SpeculativeEngine(target, drafter, {1})
        drafts = [e.drafted for e in engine.generate([0, 5, 6, 7, 8, 5, 6], k=3, max_new_tokens=24)]
        with torch.inference_mode():
            step = drafter._step(torch.tensor([9]), drafter.features[-1:], drafter.cache.get_seq_length())
        guesses[name] = (drafts, step)
    assert guesses["lean"][0] == guesses["dispatched"][0]
    assert torch.allclose(guesses["lean"][1], guesses["dispatched"][1], atol=1e-5)


def test_the_learning_rate_decays_by_cosine_to_a_tenth_and_each_step_uses_its_own(target):
    assert learning_rate(1.0, 0, 0) == learning_rate(1.0, 500, 0) == 1.0
    assert learning_rate(1.0, 0, 100) == 1.0
    assert learning_rate(1.0, 50, 100) == pytest.approx(0.55)
    assert learning_rate(1.0, 100, 100) == learning_rate(1.0, 400, 100) == pytest.approx(0.1)
    torch.manual_seed(4)
    head = DraftHead(head_config(target))
    student = HeadStudent(head, target, None, unroll=1, noise=0.0)
    trainer = Trainer(student, [example(target, (-1,))], [], None, 0, lr=1e-3, batch_size=1, decay_steps=4)
    seen = []
    trainer.run(Budget(steps=5), on_step=lambda step, loss: seen.append(trainer.optimizer.param_groups[0]["lr"]))
    assert seen == pytest.approx([learning_rate(1e-3, s, 4) for s in range(5)])
