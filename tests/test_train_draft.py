"""`specdec train-draft` on a tiny target: both kinds train, load, draft, and never change the output."""

import json

import pytest
import torch
from exactness import VOCAB, assert_lossless, small_models
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.coupling import PositionNoise
from specdec_cli.decoding.drafters.base import Draft, Drafter, Needs, Verified
from specdec_cli.decoding.drafters.lookup import LookupFirst
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.drafters.head import HeadDrafter, load_head
from specdec_cli.decoding.head_network import DraftHead, head_config
from specdec_cli.pairs.meta import read_meta
from specdec_cli.errors import UserError
from specdec_cli.pairs.loading import load
from specdec_cli.pairs.registry import parse_model
from specdec_cli.pairs.tokenization import check_compatible
from specdec_cli.training.distill import Example, soft_cross_entropy, top_vocab
from specdec_cli.training.loop import draft_from_target, narrow_draft

runner = CliRunner()
PROMPTS = ["abcabcabc", "hello there", "def f(x): return x", "the cat sat on the mat", "1 2 3 4 5", "xyzzy plugh"]


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "scenario": "code" if i % 2 else "chat"}) + "\n" for i, p in enumerate(PROMPTS)))
    return path


def train(pair_dir, prompt_file, out, kind, *extra):
    return runner.invoke(app, ["train-draft", "--models", str(pair_dir / "models.yaml"), "--prompts", str(prompt_file),
                               "--out", str(out), "--kind", kind, "--max-new-tokens", "12", "--batch-size", "4", "--json", *extra])


@pytest.fixture(scope="module")
def trained(pair_dir, prompt_file, tmp_path_factory):
    """One drafter of each kind, trained for a few steps (the head with a restricted output layer)."""
    root = tmp_path_factory.mktemp("trained")
    results = {}
    for kind, extra in (("model", ()), ("head", ("--top-vocab", "40"))):
        result = train(pair_dir, prompt_file, root / kind, kind, "--steps", "12", *extra)
        assert result.exit_code == 0, result.output
        results[kind] = (root / kind, json.loads(result.stdout))
    return results


@pytest.fixture(scope="module")
def loaded_target(pair_dir):
    return load(parse_model(str(pair_dir / "target")))


def drafter_for(trained, kind, target):
    out = trained[kind][0]
    if kind == "head":
        return load_head(out, target.model, target.source)
    draft = load(parse_model(str(out)))
    check_compatible(target.tokenizer, draft.tokenizer)  # the target's own tokenizer travels with it
    return ModelDrafter(draft.model, target.model.config.vocab_size)


def test_both_kinds_train_save_load_and_draft(trained, loaded_target):
    for kind in ("model", "head"):
        out, summary = trained[kind]
        assert summary["steps"] == 12 and summary["kind"] == kind and 0 <= summary["heldout_agreement"] <= 1
        meta = read_meta(out)
        assert meta["kind"] == kind and meta["training"]["steps"] == 12
        assert (out / "heldout.jsonl").read_text().count("\n") == 1  # 10% of 6 prompts, at least one
        drafter = drafter_for(trained, kind, loaded_target)
        engine = SpeculativeEngine(loaded_target.model, drafter, {1})
        events = list(engine.generate([0, 5, 6, 7], k=3, max_new_tokens=8))
        assert sum(len(e.drafted) for e in events) > 0
    assert (trained["model"][0] / "model.safetensors").is_file() and (trained["model"][0] / "tokenizer.json").is_file()
    assert meta["top_vocab"] is not None and len(meta["top_vocab"]) == 40 and 1 in meta["top_vocab"]  # EOS kept


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["model", "head"])
def test_greedy_output_with_a_trained_drafter_is_the_targets(trained, loaded_target, kind):
    target = loaded_target.model
    for prompt in ([0, 5, 6, 7, 8, 5, 6], [0, 40, 41, 42]):
        plain = [t for e in SpeculativeEngine(target, None, {1}).generate(prompt, k=0, max_new_tokens=30) for t in e.emitted]
        for k in range(1, 5):
            engine = SpeculativeEngine(target, drafter_for(trained, kind, loaded_target), {1})
            assert [t for e in engine.generate(prompt, k=k, max_new_tokens=30) for t in e.emitted] == plain


@pytest.mark.slow
def test_training_lowers_the_loss_and_resume_continues_without_new_answers(pair_dir, prompt_file, tmp_path, monkeypatch):
    out = tmp_path / "head"
    assert train(pair_dir, prompt_file, out, "head", "--steps", "5").exit_code == 0
    import specdec_cli.training.draft_job as job

    monkeypatch.setattr(job, "answer", lambda *a, **k: pytest.fail("resume must reuse the checkpointed data"))
    result = train(pair_dir, prompt_file, out, "head", "--steps", "60", "--resume")
    assert result.exit_code == 0, result.output
    history = torch.load(out / "checkpoint" / "state.pt", weights_only=True)["history"]  # data only: no pickle runs
    assert [h["step"] for h in history] == list(range(1, 61))  # one history across both runs
    first, last = sum(h["loss"] for h in history[:5]), sum(h["loss"] for h in history[-5:])
    assert last < first
    again = train(pair_dir, prompt_file, out, "head", "--steps", "10")
    assert again.exit_code == 2 and "pass --resume" in again.stderr
    wrong = train(pair_dir, prompt_file, out, "model", "--steps", "70", "--resume")
    assert wrong.exit_code == 2 and "trains a 'head' drafter" in wrong.stderr


@pytest.mark.parametrize(
    "args, message",
    [(["--kind", "wizard", "--steps", "1"], "unknown drafter kind 'wizard'"),
     (["--kind", "head"], "give a training budget"),
     (["--kind", "head", "--steps", "1", "--resume"], "nothing to resume"),
     (["--kind", "head", "--steps", "1", "--dtype", "int3"], "unknown dtype 'int3'")],
)
def test_bad_train_draft_input_is_exit_code_2(pair_dir, prompt_file, tmp_path, args, message):
    result = runner.invoke(app, ["train-draft", "--models", str(pair_dir / "models.yaml"), "--prompts", str(prompt_file),
                                 "--out", str(tmp_path / "x"), *args])
    assert result.exit_code == 2 and message in " ".join(result.stderr.split())


def test_a_head_trains_on_the_target_at_the_dtype_asked_for(pair_dir, prompt_file, tmp_path, monkeypatch):
    from specdec_cli.training import draft_job

    loaded = []
    real_load = draft_job.load
    monkeypatch.setattr(draft_job, "load", lambda spec: loaded.append(spec.dtype) or real_load(spec))
    result = train(pair_dir, prompt_file, tmp_path / "int4", "head", "--steps", "2", "--dtype", "int4")
    assert result.exit_code == 0, result.output
    assert loaded == ["int4"]


def test_a_head_for_another_target_is_refused(trained, pair_dir):
    head = trained["head"][0]
    ok = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--drafter", "head", "--draft", str(head),
                             "--json", "--max-new-tokens", "4", "hi"])
    assert ok.exit_code == 0, ok.output
    result = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--target", str(pair_dir / "draft"),
                                 "--draft", str(head), "--max-new-tokens", "4", "hi"])
    assert result.exit_code == 2
    assert "was trained for target" in " ".join(result.stderr.split()) and "Traceback" not in result.output
    no_head = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--drafter", "head", "hi"])
    assert no_head.exit_code == 2 and "has no draft head" in no_head.stderr


def test_a_pair_can_name_its_head_in_models_yaml(trained, pair_dir, tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(f"pairs:\n  tiny-head:\n    target: {pair_dir / 'target'}\n    draft: {{kind: head, source: {trained['head'][0]}}}\n    k: 2\n")
    result = runner.invoke(app, ["generate", "--models", str(models), "--json", "--max-new-tokens", "6", "abc"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stats"]["drafted"] > 0


def test_bench_reports_head_mode_with_every_field(trained, pair_dir, prompt_file):
    from test_bench import FIELDS

    result = runner.invoke(app, ["bench", "--models", str(pair_dir / "models.yaml"), "--prompts", str(prompt_file),
                                 "--draft", str(trained["head"][0]), "--modes", "plain,hf-plain,ngram:3,head:3",
                                 "--max-new-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    head = report["modes"]["head:3"]
    assert FIELDS <= set(head) and head["identical_to_plain"] is True
    assert head["predicted_speedup"] is not None and head["acceptance_rate"] is not None
    assert set(report["scenarios"]) == {"code", "chat"} and "head:3" in report["scenarios"]["code"]
    assert report["manifest"]["draft"]["target"]["fingerprint"]


# --- the engine's feature hand-over and the head's cache ----------------------------------------


class Recorder(Drafter):
    """Drafts with the target itself, and keeps every feature the engine hands over."""

    needs = Needs(features=(-1,))
    name = "recorder"

    def __init__(self, target):
        self.inner, self.rows = ModelDrafter(target, target.config.vocab_size), []

    def reset(self):
        self.inner.reset()
        self.rows = []

    def observe(self, verified):
        if verified.features is not None:
            self.rows.append(verified.features.clone())

    def propose(self, context, k, sampling, generator, gate=None):
        assert sum(r.shape[0] for r in self.rows) == context.shape[0] - 1  # one row per cached token
        return self.inner.propose(context, k, sampling, generator)


def test_engine_hands_over_the_targets_last_hidden_state_of_every_cached_position(target, similar):
    recorder = Recorder(similar)  # a draft that is partly rejected, so rollback is exercised
    prompt = [0, 5, 6, 7, 8, 5, 6]
    events = list(SpeculativeEngine(target, recorder, {1}).generate(prompt, k=3, max_new_tokens=20))
    assert any(0 < e.accepted < len(e.drafted) for e in events)
    tokens = prompt + [t for e in events for t in e.emitted]
    with torch.no_grad():
        expected = target.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
    handed = torch.cat(recorder.rows)
    assert handed.shape[0] == len(tokens) - 1
    assert torch.allclose(handed, expected, atol=1e-4)


def test_head_cache_keeps_only_positions_computed_from_true_features(target):
    torch.manual_seed(3)
    head = DraftHead(head_config(target))
    drafter, fresh = HeadDrafter(head, target), HeadDrafter(head, target)
    tokens = torch.tensor([0, 5, 6, 7, 8, 9])
    with torch.no_grad():
        features = target.model(tokens[None]).last_hidden_state[0]
    drafter.reset()
    drafter.observe(Verified(tokens[:4], 4, features=features[:3]))
    first = drafter.propose(tokens[:4], 4, SamplingParams(), None)
    assert drafter.cache.get_seq_length() == 4 + 3  # 4 true positions, 3 drafted on its own guesses
    drafter.observe(Verified(tokens, 4, features=features[3:5]))  # two more tokens confirmed
    again = drafter.propose(tokens, 3, SamplingParams(), None)
    assert drafter.cache.get_seq_length() == 6 + 2
    fresh.reset()
    fresh.observe(Verified(tokens, 6, features=features[:5]))
    assert torch.equal(again.tokens, fresh.propose(tokens, 3, SamplingParams(), None).tokens)
    assert first.tokens.shape[0] == 4


# --- a restricted output layer keeps sampling lossless ------------------------------------------

SUBSET = torch.tensor([0, 2, 3, 6])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["model", "head"])
def test_restricted_output_layer_keeps_speculative_sampling_exact(kind):
    target, disagreeing = small_models()
    if kind == "model":
        drafter = ModelDrafter(disagreeing, VOCAB, allowed=SUBSET)
    else:
        torch.manual_seed(0)
        drafter = HeadDrafter(DraftHead(head_config(target)), target, allowed=SUBSET)
    drafter.reset()
    if kind == "head":
        with torch.no_grad():
            features = target.model(torch.tensor([[3, 4]])).last_hidden_state[0]
        drafter.observe(Verified(torch.tensor([3, 4, 5]), 3, features=features))
    draft = drafter.propose(torch.tensor([3, 4, 5]), 2, SamplingParams(1.0), PositionNoise(0, VOCAB, origin=3))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[SUBSET] = False
    assert (draft.probs[:, outside] == 0).all() and (draft.probs[:, SUBSET] > 0).all()  # q is zero outside the set
    assert_lossless(target, drafter, SamplingParams(1.0))


# --- pieces -------------------------------------------------------------------------------------


def test_draft_from_target_copies_first_and_last_layer(target):
    draft = draft_from_target(target, layers=2)
    assert draft.config.num_hidden_layers == 2
    last = target.config.num_hidden_layers - 1
    assert torch.equal(draft.model.layers[0].self_attn.q_proj.weight, target.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(draft.model.layers[1].mlp.up_proj.weight, target.model.layers[last].mlp.up_proj.weight)
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight) and torch.equal(draft.model.norm.weight, target.model.norm.weight)


def test_top_vocab_counts_training_answers_and_keeps_eos():
    ids = torch.tensor([9, 9, 4, 4, 4, 5, 5, 7])
    examples = [Example(ids, 2, torch.zeros(6, 1), torch.zeros(6, 1)), Example(torch.tensor([9, 8, 8, 8, 8]), 1, None, None, heldout=True)]
    assert top_vocab(examples, 3, {1}, 50) == [1, 4, 5]  # 8 is frequent only in held-out answers
    assert top_vocab(examples, 0, {1}, 50) is None


def test_soft_cross_entropy_drops_teacher_mass_outside_the_output_layer():
    logits = torch.tensor([[0.0, 1.0, 2.0]])  # columns of a restricted layer holding ids 4, 7, 9
    slots = torch.full((10,), -1)
    slots[torch.tensor([4, 7, 9])] = torch.arange(3)
    top_ids, top_logp = torch.tensor([[7, 3, 9]]), torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    logq = torch.log_softmax(logits, -1)[0]
    expected = -(0.5 / 0.7 * logq[1] + 0.2 / 0.7 * logq[2])
    assert torch.allclose(soft_cross_entropy(logits, top_ids, top_logp, slots), expected)


def test_narrow_draft_keeps_the_most_of_the_targets_embedding(target):
    draft = narrow_draft(target, hidden=16, layers=3)
    assert draft.config.hidden_size == 16 and draft.config.num_hidden_layers == 3
    assert draft.get_output_embeddings().weight.data_ptr() == draft.get_input_embeddings().weight.data_ptr()  # tied
    singular = torch.linalg.svdvals(target.get_input_embeddings().weight.detach())
    kept = draft.get_input_embeddings().weight.detach().pow(2).sum()
    assert torch.isclose(kept, singular[:16].pow(2).sum(), rtol=1e-4)  # a projection onto the top 16 directions
    with pytest.raises(UserError, match="below the target's width"):
        narrow_draft(target, hidden=target.config.hidden_size)


def test_data_from_reuses_another_runs_answers(trained, pair_dir, loaded_target, tmp_path):
    head_run = trained["head"][0]
    result = runner.invoke(app, ["train-draft", "--models", str(pair_dir / "models.yaml"), "--data-from", str(head_run),
                                 "--out", str(tmp_path / "narrow"), "--kind", "model", "--hidden-size", "16", "--steps", "3",
                                 "--batch-size", "4", "--json"])
    assert result.exit_code == 0, result.output
    made = torch.load(head_run / "checkpoint" / "data.pt", weights_only=True)
    reused = torch.load(tmp_path / "narrow" / "checkpoint" / "data.pt", weights_only=True)
    assert [e["ids"].tolist() for e in reused["examples"]] == [e["ids"].tolist() for e in made["examples"]]
    assert reused["examples"][0]["hidden"] is None and reused["kind"] == "model"
    draft = load(parse_model(str(tmp_path / "narrow")))
    assert draft.model.config.hidden_size == 16
    saved = json.loads((tmp_path / "narrow" / "config.json").read_text())
    assert saved.get("dtype", saved.get("torch_dtype")) == "bfloat16"  # half the file; drafts only propose
    drafter = ModelDrafter(draft.model, loaded_target.model.config.vocab_size)
    engine = SpeculativeEngine(loaded_target.model, drafter, {1})
    plain = [t for e in SpeculativeEngine(loaded_target.model, None, {1}).generate([5, 6, 7], k=0, max_new_tokens=10) for t in e.emitted]
    assert [t for e in engine.generate([5, 6, 7], k=3, max_new_tokens=10) for t in e.emitted] == plain


def test_a_head_from_a_models_answers_gets_a_fresh_teacher_pass(trained, pair_dir, tmp_path):
    result = runner.invoke(app, ["train-draft", "--models", str(pair_dir / "models.yaml"), "--data-from", str(trained["model"][0]),
                                 "--out", str(tmp_path / "head"), "--kind", "head", "--steps", "2", "--batch-size", "4", "--json"])
    assert result.exit_code == 0, result.output
    data = torch.load(tmp_path / "head" / "checkpoint" / "data.pt", weights_only=True)
    assert all(e["hidden"] is not None and e["hidden"].shape[0] == e["ids"].shape[0] for e in data["examples"])


@pytest.mark.parametrize(
    "args, message",
    [(["--prompts", "PROMPTS", "--data-from", "RUN"], "drop --prompts"),
     (["--data-from", "EMPTY"], "no checkpoint/data.pt there"),
     ([], "give the prompts to train on")],
)
def test_bad_data_sources_are_exit_code_2(trained, pair_dir, prompt_file, tmp_path, args, message):
    names = {"PROMPTS": str(prompt_file), "RUN": str(trained["head"][0]), "EMPTY": str(tmp_path)}
    result = runner.invoke(app, ["train-draft", "--models", str(pair_dir / "models.yaml"), "--out", str(tmp_path / "x"),
                                 "--kind", "model", "--steps", "1", *[names.get(a, a) for a in args]])
    assert result.exit_code == 2 and message in " ".join(result.stderr.split())


# --- lookup first, a learned drafter elsewhere -------------------------------------------------------


def test_lookup_first_drafts_from_a_repeat_and_otherwise_asks_the_learned_drafter():
    class Learned(Drafter):
        name, calls = "stub", 0

        def reset(self):
            pass

        def propose(self, context, k, sampling, generator, gate=None):
            Learned.calls += 1
            return Draft(torch.full((k,), 77))

    drafter = LookupFirst(Learned())
    repeat = drafter.propose(torch.tensor([5, 6, 9, 8, 5, 6]), 2, SamplingParams(), None)
    assert repeat.tokens.tolist() == [9, 8] and Learned.calls == 0  # the 2-gram 5 6 occurred before
    single = drafter.propose(torch.tensor([5, 6, 9, 8, 1, 6]), 2, SamplingParams(), None)
    assert single.tokens.tolist() == [77, 77] and Learned.calls == 1  # a 1-gram match is not enough
    assert drafter.name == "ngram+stub" and drafter.needs == Needs()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["model", "head"])
def test_lookup_first_keeps_greedy_output_and_sampling_exact(trained, loaded_target, kind):
    drafter = LookupFirst(drafter_for(trained, kind, loaded_target))
    target = loaded_target.model
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    plain = [t for e in SpeculativeEngine(target, None, {1}).generate(prompt, k=0, max_new_tokens=24) for t in e.emitted]
    assert [t for e in SpeculativeEngine(target, drafter, {1}).generate(prompt, k=3, max_new_tokens=24) for t in e.emitted] == plain
    small, disagreeing = small_models()
    if kind == "model":
        learned = ModelDrafter(disagreeing, VOCAB)
    else:
        torch.manual_seed(0)
        learned = HeadDrafter(DraftHead(head_config(small)), small)
    sampling, repeating = SamplingParams(1.0), [3, 4, 3, 4]  # the first round drafts by lookup: 3 4 -> 3 4
    assert_lossless(small, LookupFirst(learned), sampling, prompt=repeating)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_teacher_scores_a_quantised_target_on_dense_weights_as_its_kernels_would(kind, monkeypatch):
    """The teacher's dense matmuls (quantize.dense_kernels, entered by distill.teacher) are the
    kernels' arithmetic up to summation order: same top ids, log-probs and features to round-off,
    the kernels restored, and a caller's context reused."""
    import contextlib

    from conftest import tiny_llama

    from specdec_cli.runtime.quantize import Int4Linear, Int8Linear, quantise_model
    from specdec_cli.training import distill

    target = quantise_model(tiny_llama(seed=3, hidden=64), kind)
    quantised = [m for m in target.modules() if isinstance(m, (Int4Linear, Int8Linear))]
    sequences = [([0, 5, 6, 7, 8, 9, 10, 11, 12], 3), ([0, 40, 41, 42, 43], 2)]
    dense = distill.teacher(target, sequences, 4, True, 2, 0, layers=(1, -1))
    assert all("forward" not in vars(m) for m in quantised)  # the kernels' forward is back
    with monkeypatch.context() as patch:
        patch.setattr(distill, "dense_kernels", contextlib.nullcontext)
        kernels = distill.teacher(target, sequences, 4, True, 2, 0, layers=(1, -1))
    for d, k in zip(dense, kernels):
        assert torch.equal(d.top_ids[:, 0], k.top_ids[:, 0])
        torch.testing.assert_close(d.top_logp, k.top_logp, atol=5e-2, rtol=0)  # bfloat16 outputs round at 2^-8
        torch.testing.assert_close(d.hidden, k.hidden, atol=2e-2, rtol=2e-2)
    with distill.dense_kernels(target):  # a caller's context (a teacher pass over many shards): de-quantised once
        outer = [vars(m)["forward"] for m in quantised]
        distill.teacher(target, sequences, 4, True, 2, 0, layers=(1, -1))
        assert [vars(m)["forward"] for m in quantised] == outer  # the teacher's own context reused them
    with pytest.raises(RuntimeError), distill.dense_kernels(target):
        assert all("forward" in vars(m) for m in quantised)
        raise RuntimeError("a failed batch")
    assert all("forward" not in vars(m) for m in quantised)
