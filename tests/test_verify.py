"""`specdec verify-equivalence` on the tiny pairs of conftest: exit codes, located divergences, sampling."""

import json

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency
from typer.testing import CliRunner

import specdec_cli.commands.verify as verify_module
import specdec_cli.decoding.engine as engine_module
from specdec_cli.cli import app
from specdec_cli.commands.common import resolve_pair
from specdec_cli.decoding.acceptance import greedy_accept
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.measure.equivalence import MISMATCH, NEAR_TIE, classify, decode, first_difference
from specdec_cli.measure.sampling_check import permutation_test
from specdec_cli.pairs.tokenization import encode_prompt

PROMPTS = ['{"id": "greet", "prompt": "hello world, hello"}', '{"id": "code", "prompt": "def f(x): return x"}',
           "some plain text here"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models spend their time in thread hand-offs; on a shared 2-core box two threads can make
    a verify forward 50× slower. One thread keeps these tests fast and changes no result."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(PROMPTS) + "\n")
    return path


def invoke(pair_dir, *args):
    return CliRunner().invoke(app, ["verify-equivalence", "--models", str(pair_dir / "models.yaml"), *map(str, args)])


def run_json(pair_dir, *args):
    result = invoke(pair_dir, *args, "--json")
    assert result.exit_code in (0, 1), result.output
    return result, json.loads(result.stdout)


def test_correct_engine_is_equivalent_and_the_report_matches_stdout(pair_dir, prompt_file, tmp_path):
    report = tmp_path / "report.json"
    result, data = run_json(pair_dir, "--prompts", prompt_file, "--k", "1,3,3", "--max-new-tokens", 24, "--report", report)
    assert result.exit_code == 0 and data["equivalent"] and data["verdict"].startswith("EQUIVALENT")
    assert data["ks"] == [1, 3] and data["divergences"] == []
    assert len(data["runs"]) == 6 and all(r["identical"] and r["identical_to_transformers"] for r in data["runs"])
    assert all(r["identical"] for r in data["transformers"])
    for run in data["runs"]:  # lengths and rounds shown per prompt and K, not assumed
        assert run["plain"]["new_tokens"] == run["speculative"]["new_tokens"] == run["plain"]["rounds"]
        assert run["speculative"]["rounds"] <= run["plain"]["rounds"]
    assert data["totals"]["3"]["plain_tokens"] == sum(r["plain"]["new_tokens"] for r in data["runs"] if r["k"] == 3)
    assert json.loads(report.read_text()) == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl", "report.json"]  # no temp file left
    assert result.stderr == ""  # no progress bar when stderr is not a terminal


def test_table_and_verdict_on_stdout(pair_dir, prompt_file):
    result = invoke(pair_dir, "--prompts", prompt_file, "--k", "2", "--max-new-tokens", 12)
    assert result.exit_code == 0, result.output
    assert "K = 2" in result.stdout and "greet" in result.stdout and "total" in result.stdout
    assert "EQUIVALENT: 3/3 speculative runs token-identical" in result.stdout


def test_progress_bar_only_on_a_terminal(pair_dir, prompt_file, monkeypatch):
    import io

    from rich.console import Console

    screen = io.StringIO()
    monkeypatch.setattr(verify_module, "stderr_console", lambda: Console(file=screen, force_terminal=True, width=100))
    result = invoke(pair_dir, "--prompts", prompt_file, "--k", "1,2", "--max-new-tokens", 8, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["equivalent"]
    assert "6/6" in screen.getvalue()  # prompts × K steps, drawn on the (fake) terminal


def over_accepting(draft, logits):
    """A broken greedy test: after a rejection it keeps one more (wrong) draft token."""
    n, token = greedy_accept(draft, logits)
    if n < draft.shape[0]:
        return n + 1, int(logits[n + 1].argmax())
    return n, token


def test_wrong_engine_fails_with_a_mismatch_at_the_first_wrong_token(pair_dir, tmp_path, monkeypatch):
    text = "some plain text here"
    (tmp_path / "one.txt").write_text(text + "\n")
    monkeypatch.setattr(engine_module, "greedy_accept", over_accepting)
    runtime = load_pair(resolve_pair(str(pair_dir / "models.yaml"), "tiny"))
    ids = encode_prompt(runtime.tokenizer, text)
    plain, wrong = decode(runtime.engine, ids, 0, 30).tokens, decode(runtime.engine, ids, 3, 30).tokens
    assert plain != wrong
    expected = next(i for i, (a, b) in enumerate(zip(plain, wrong)) if a != b)

    result, data = run_json(pair_dir, "--prompts", tmp_path / "one.txt", "--k", "3", "--max-new-tokens", 30)
    assert result.exit_code == 1 and not data["equivalent"]
    [divergence] = data["divergences"]
    assert divergence["kind"] == MISMATCH and divergence["k"] == 3 and divergence["position"] == expected
    assert (divergence["plain_token"], divergence["other_token"]) == (plain[expected], wrong[expected])
    assert divergence["margin_plain"] > 0.01 and divergence["margin_other"] > 0.01  # the target never chose it
    assert data["counts"] == {MISMATCH: 1, NEAR_TIE: 0}


def make_near_tie(monkeypatch, mode: str, state: dict):
    """Wrap load_pair() so that the target ranks tokens a and b within one float step wherever a leads:
    a wins a one-token forward by one ulp, while in a multi-token (verification) forward b is one ulp
    ahead ("flip") or exactly equal and first by index ("tie"). That is what round-off between
    forwards of different shape does to a real near-tie, made deterministic."""
    real_load_pair = load_pair

    def load_pair_with_tie(spec):
        runtime = real_load_pair(spec)
        ids = encode_prompt(runtime.tokenizer, state["text"])
        plain = decode(runtime.engine, ids, 0, 30).tokens
        a = plain[3]
        b = min(t for t in range(a) if t not in plain) if mode == "tie" else max(set(range(98)) - set(plain))
        state.update(a=a, b=b, expected=plain.index(a), plain=plain)

        def hook(module, inputs, logits):
            logits = logits.clone()
            if logits.shape[1] == 1:
                logits[..., b] = torch.nextafter(logits[..., a], torch.tensor(-float("inf")))
            else:
                logits[..., b] = logits[..., a] if mode == "tie" else torch.nextafter(logits[..., a], torch.tensor(float("inf")))
            return logits

        runtime.target.model.lm_head.register_forward_hook(hook)
        assert decode(runtime.engine, ids, 0, 30).tokens == plain  # one-token forwards are unchanged
        return runtime

    monkeypatch.setattr("specdec_cli.decoding.loaded_pair.load_pair", load_pair_with_tie)  # the command imports it when it runs


@pytest.mark.parametrize("mode", ["flip", "tie"])
def test_constructed_near_tie_is_reported_not_failed_unless_strict(pair_dir, tmp_path, monkeypatch, mode):
    state = {"text": "some plain text here"}
    (tmp_path / "one.txt").write_text(state["text"] + "\n")
    make_near_tie(monkeypatch, mode, state)
    result, data = run_json(pair_dir, "--prompts", tmp_path / "one.txt", "--k", "3", "--max-new-tokens", 30)
    assert result.exit_code == 0 and data["equivalent"]
    [divergence] = data["divergences"]
    assert divergence["kind"] == NEAR_TIE and divergence["position"] == state["expected"]
    assert (divergence["plain_token"], divergence["other_token"]) == (state["a"], state["b"])
    assert 0 < divergence["margin_plain"] < 1e-5
    assert (divergence["margin_other"] == 0.0) if mode == "tie" else (-1e-5 < divergence["margin_other"] < 0)
    assert data["counts"] == {MISMATCH: 0, NEAR_TIE: 1} and "1 numerical near-tie" in data["verdict"]

    strict, data = run_json(pair_dir, "--prompts", tmp_path / "one.txt", "--k", "3", "--max-new-tokens", 30, "--strict")
    assert strict.exit_code == 1 and data["divergences"][0]["kind"] == NEAR_TIE


def wrap_load_pair(monkeypatch, change):
    real_load_pair = load_pair

    def load_pair_and_change(spec):
        runtime = real_load_pair(spec)
        change(runtime)
        return runtime

    monkeypatch.setattr("specdec_cli.decoding.loaded_pair.load_pair", load_pair_and_change)  # the command imports it when it runs


def test_transformers_reference_ignores_the_generation_configs_penalties(pair_dir, prompt_file, monkeypatch):
    def penalise(runtime):
        runtime.target.model.generation_config.repetition_penalty = 3.0
        runtime.target.model.generation_config.no_repeat_ngram_size = 2

    wrap_load_pair(monkeypatch, penalise)
    result, data = run_json(pair_dir, "--prompts", prompt_file, "--k", "2", "--max-new-tokens", 24)
    assert result.exit_code == 0 and all(r["identical"] for r in data["transformers"])


def test_a_wrong_transformers_path_is_located_and_classified_too(pair_dir, tmp_path, monkeypatch):
    """transformers made to skip its argmax at step 4: a mismatch against the reference, at position 4."""
    from transformers import LogitsProcessorList

    text = "some plain text here"
    (tmp_path / "one.txt").write_text(text + "\n")
    state = {}

    def ban_at_step_4(runtime):
        ids = encode_prompt(runtime.tokenizer, text)
        state["plain"] = plain = decode(runtime.engine, ids, 0, 20).tokens
        model, generate = runtime.target.model, runtime.target.model.generate

        def ban(input_ids, scores):
            if input_ids.shape[1] == len(ids) + 4:
                scores = scores.clone()
                scores[:, plain[4]] = -float("inf")
            return scores

        model.generate = lambda *a, **kw: generate(*a, logits_processor=LogitsProcessorList([ban]), **kw)

    wrap_load_pair(monkeypatch, ban_at_step_4)
    result, data = run_json(pair_dir, "--prompts", tmp_path / "one.txt", "--k", "2", "--max-new-tokens", 20)
    assert result.exit_code == 1
    [divergence] = data["divergences"]
    assert divergence["against"] == "transformers" and divergence["k"] is None and divergence["position"] == 4
    assert divergence["plain_token"] == state["plain"][4] and divergence["kind"] == MISMATCH
    assert divergence["margin_plain"] > 0 and divergence["margin_other"] > 0  # raw logits: transformers preferred it too
    assert data["runs"][0]["identical"] and not data["runs"][0]["identical_to_transformers"]


@pytest.mark.parametrize(
    "plain, other, kind",
    [(2e-7, -2e-7, NEAR_TIE), (0.0, 0.0, NEAR_TIE), (3e-4, 0.0, NEAR_TIE), (0.0, -5e-4, NEAR_TIE),
     (2e-7, 2e-7, MISMATCH),  # the verification forward also preferred the plain token: emitted anyway
     (-2e-7, -2e-7, MISMATCH), (0.5, -0.5, MISMATCH), (2e-3, -1e-5, MISMATCH), (None, 0.0, MISMATCH)],
)
def test_classification(plain, other, kind):
    assert classify(plain, other, 1e-3) == kind


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


# --- sampling ----------------------------------------------------------------------------------------

def accept_everything(draft, scores):
    """A planted bug: every draft token is kept without asking whether it is the target's choice."""
    k = draft.shape[0]
    return k, int(scores[k].argmax())


@pytest.mark.parametrize("biased", [False, True])
def test_sampling_check_passes_the_real_sampler_and_fails_a_biased_one(pair_dir, tmp_path, monkeypatch, biased):
    (tmp_path / "repeat.txt").write_text("abcabcabcab\n")  # the n-gram drafter proposes "cab..." here
    if biased:
        monkeypatch.setattr(engine_module, "greedy_accept", accept_everything)
    result, data = run_json(pair_dir, "--prompts", tmp_path / "repeat.txt", "--pair", "tiny-ngram", "--k", "2",
                            "--max-new-tokens", 4, "--sampling", 200)
    sampling = data["sampling"]
    assert sampling["drafted"] > 0 and len(sampling["tests"]) == 2 and sampling["seeded"] == 200
    assert sampling["threshold"] == pytest.approx(0.01 / 2)
    assert sampling["min_p"] >= sampling["threshold"]  # plain sampling is the target's, bug or not
    if biased:
        assert result.exit_code == 1 and not sampling["passed"]
        assert sampling["identical"] < 200 and len(sampling["divergences"]) == 200 - sampling["identical"]
        assert {d["kind"] for d in sampling["divergences"]} == {"mismatch"}
        assert "seeded speculative runs token-identical to plain sampling" in data["verdict"]
    else:
        assert result.exit_code == 0 and sampling["passed"]
        assert sampling["identical"] == 200 and sampling["divergences"] == []
        assert "no evidence that plain sampling and transformers' sampler differ" in sampling["verdict"]


def test_permutation_test_agrees_with_scipy_and_can_reject():
    rng = np.random.default_rng(0)
    same = rng.choice(4, 400, p=[0.4, 0.3, 0.2, 0.1]), rng.choice(4, 400, p=[0.4, 0.3, 0.2, 0.1])
    shifted = rng.choice(4, 400, p=[0.4, 0.3, 0.2, 0.1]), rng.choice(4, 400, p=[0.25, 0.3, 0.25, 0.2])
    for a, b in (same, shifted):
        table = [np.bincount(a, minlength=4), np.bincount(b, minlength=4)]
        assert permutation_test(list(a), list(b), 4999) == pytest.approx(chi2_contingency(table).pvalue, abs=0.02)
    assert permutation_test(list(shifted[0]), list(shifted[1]), 4999) == pytest.approx(1 / 5000)
    assert permutation_test([7] * 10, [7] * 12, 99) == 1.0


# --- bad input ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompts", "{tmp}/nowhere.jsonl"], "prompt file not found"),
        (["--prompts", "{tmp}"], "prompt file {tmp}: is a directory; give a file"),
        (["--prompts", "{tmp}/empty.jsonl"], "no prompts in"),
        (["--prompts", "{tmp}/broken.jsonl"], "broken.jsonl line 2: malformed JSON"),
        (["--prompts", "{tmp}/ok.jsonl", "--pair", "nope"], "unknown pair 'nope'"),
        (["--prompts", "{tmp}/ok.jsonl", "--k", "1,x"], "--k '1,x': K must be an integer from 0 to 32, got 'x'"),
        (["--prompts", "{tmp}/ok.jsonl", "--k", "-1"], "--k '-1': K must be from 0 to 32, got -1"),
        (["--prompts", "{tmp}/ok.jsonl", "--k", "33"], "--k '33': K must be from 0 to 32, got 33"),
        (["--prompts", "{tmp}/ok.jsonl", "--k", "1,,4"], "--k '1,,4': expected comma-separated integers"),
        (["--prompts", "{tmp}/ok.jsonl", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["--prompts", "{tmp}/ok.jsonl", "--sampling", "-3"], "--sampling must be 0"),
        (["--prompts", "{tmp}/ok.jsonl", "--tolerance", "0"], "--tolerance must be above 0"),
        (["--prompts", "{tmp}/ok.jsonl", "--report", "{tmp}"], "is a directory; give a file name"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(pair_dir, tmp_path, args, message):
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "fine"}\n{"prompt": \n')
    (tmp_path / "ok.jsonl").write_text("hello\n")
    result = invoke(pair_dir, *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2
    assert message.format(tmp=tmp_path) in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
