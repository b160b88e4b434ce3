"""calibrate-k and profiles: measured figures on tiny models, the verdicts, profile files, hot reload."""

import json
import math
import os
import sys
import re
from contextlib import contextmanager

import pytest
import torch
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.drafters.base import Draft, Drafter
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.errors import UserError
from specdec_cli.commands.calibrate import parse_ks
from specdec_cli.measure import calibration
from specdec_cli.measure.calibration import summarise_all, sweep
from specdec_cli.pairs.profile import (
    PairProfile,
    ScenarioProfile,
    drafter_identity,
    head_hash,
    read_profiles,
    write_profile,
)
from specdec_cli.pairs.registry import load_registry


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Timings here decide verdicts: on a shared CPU, torch's thread pool spinning against other
    processes makes tiny forwards ten times slower and erratic; one thread keeps them steady."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


PROMPTS = [("code", [0, 5, 6, 7, 8, 5, 6, 7, 9]), ("code", [0, 40, 41, 42, 40]), ("chat", [0, 20, 30, 20, 31]),
           ("chat", [0, 60, 61, 62])]


class OracleDrafter(Drafter):
    """Knows the target's greedy continuation of each prompt and proposes it: free, and always right."""

    name = "oracle"

    def __init__(self, sequences):
        self.sequences = sequences

    def reset(self):
        pass

    def propose(self, context, k, sampling, generator, gate=None):
        ids = context.tolist()
        for sequence in self.sequences:
            if sequence[: len(ids)] == ids:
                return Draft(torch.tensor(sequence[len(ids) : len(ids) + k], dtype=torch.long))
        return Draft.empty()


class Clock:
    """The clock calibrate's runs are timed by (``time.perf_counter`` in measure/calibration.py, under
    ``timed_by``), moved only by the Slow models: a run's seconds are its forwards' costs, the same on an
    idle machine and a busy one (slept costs are not: a stall of a tenth of a second in a busy test run
    can make K 3 beat K 8 for a draft that is always right)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@contextmanager
def timed_by(clock: Clock):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "time", clock)
        yield


class Slow:
    """A model whose forward costs what a real one's does (a fixed cost plus a little per token) on
    ``clock``, so that speeds measured on tiny models mean something."""

    def __init__(self, model, clock: Clock, base_s=0.005, per_token_s=0.0004):
        self.model, self.clock, self.base_s, self.per_token_s = model, clock, base_s, per_token_s

    def __call__(self, input_ids, **kwargs):
        self.clock.now += self.base_s + self.per_token_s * input_ids.shape[-1]
        return self.model(input_ids, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def greedy(target, prompt, n):
    return [t for e in SpeculativeEngine(target, None, {1}).generate(prompt, k=0, max_new_tokens=n) for t in e.emitted]


@pytest.fixture(scope="module")
def oracle_calibration(target):
    n = 64
    oracle, clock = OracleDrafter([ids + greedy(target, ids, n) for _, ids in PROMPTS]), Clock()
    with timed_by(clock):
        measured = sweep(SpeculativeEngine(Slow(target, clock), oracle, {1}), PROMPTS, [0, 1, 3, 8], n)
    return measured, summarise_all(measured)


def test_draft_equal_to_target_accepts_everything_and_picks_the_largest_k(target, oracle_calibration):
    measured, (scenarios, overall) = oracle_calibration
    assert list(scenarios) == ["code", "chat"]
    for name, result in scenarios.items():
        lengths = [len(greedy(target, ids, 64)) for scenario, ids in PROMPTS if scenario == name]
        for f in result.per_k:
            assert f.new_tokens == sum(lengths)  # lossless: every K emits the same tokens
            assert f.rounds == sum(math.ceil(n / (f.k + 1)) for n in lengths)
            if f.k:
                assert f.alpha == 1.0 and f.acceptance_rate == 1.0
                assert f.per_position == [1.0] * f.k
        assert result.verdict.verdict == "speculate"
        assert result.verdict.best_k == 8
        assert result.alpha == 1.0
    assert overall.prompts == 4 and overall.verdict.best_k == 8


def test_a_disagreeing_draft_is_rarely_accepted_and_speculation_is_off(target, draft):
    clock = Clock()
    engine = SpeculativeEngine(Slow(target, clock), ModelDrafter(Slow(draft, clock), target.config.vocab_size), {1})
    with timed_by(clock):
        scenarios, overall = summarise_all(sweep(engine, PROMPTS[:2], [0, 2, 4], 32))
    result = scenarios["code"]
    assert result.alpha < 0.3
    assert all(f.speedup < 1.0 for f in result.per_k if f.k)
    assert result.verdict.verdict == "off" and result.verdict.k == 0


def test_verify_costs_take_the_interpolated_median_of_block_times():
    """The reports' one percentile (serving/stats.py): of an even count the mean of the middle two, so
    a 3-token block at 4 and 6 ms over one token at 1 and 3 ms costs 2.5 (the upper middles: 2.0)."""
    from specdec_cli.measure.calibration import Tally, summarise

    plain = Tally(runs=1, wall_s=1.0, new_tokens=10, rounds=10, verify_s=0.02)
    result = summarise("s", {0: plain, 2: Tally(runs=1, wall_s=1.0)}, {1: [0.001, 0.003], 3: [0.004, 0.006]}, [0, 2])
    assert result.verify_cost == {2: pytest.approx(2.5)}


def test_parse_ks():
    assert parse_ks("0..3") == [0, 1, 2, 3]
    assert parse_ks("2,5") == [0, 2, 5]  # the K=0 baseline is always measured
    for bad, said in (("0..x", "--k takes a range like 0..8 or a list like 0,2,4; got '0..x'"),
                      ("5..2", "--k range '5..2' is empty"), ("0..40", "--k values must be from 0 to 32; got '0..40'"),
                      ("", "--k takes a range"), ("a", "--k takes a range")):
        with pytest.raises(UserError, match=re.escape(said)):
            parse_ks(bad)


# --- the command ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models_file(pair_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("calibrate")
    path = root / "models.yaml"
    path.write_text(
        f"""# hand-written pairs
default: self
pairs:
  self:
    target: {pair_dir / 'target'}
    draft: {pair_dir / 'target'}
    k: 3
  lookup-head:
    target: {pair_dir / 'target'}
    draft: {{kind: head, source: {pair_dir / 'head'}, lookup: true}}
    k: 2
  listed:
    target: {pair_dir / 'target'}
    draft: ngram
    profile: profiles/listed.yaml
"""
    )
    (root / "prompts.jsonl").write_text(
        '{"id": "c1", "scenario": "code", "prompt": "def f(x): return x"}\n{"id": "h1", "scenario": "chat", "prompt": "hello"}\n'
    )
    return path


def invoke(*args, input=None):
    return CliRunner().invoke(app, list(args), input=input)


def test_calibrate_k_command_reports_exact_acceptance_and_writes_a_profile(models_file, tmp_path):
    profile = tmp_path / "profile.yaml"
    plot = tmp_path / "curve.png"
    result = invoke("calibrate-k", "--models", str(models_file), "--prompts", str(models_file.parent / "prompts.jsonl"),
                    "--k", "0..2,4", "--max-new-tokens", "12", "--raw", "--json", "--write", "--profile", str(profile),
                    "--plot", str(plot))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["scenarios"]) == {"code", "chat"} and report["ks"] == [0, 1, 2, 4]
    for scenario in report["scenarios"].values():
        assert set(scenario) >= {"best_k", "verdict", "speedup", "break_even_alpha", "per_k"}
        assert scenario["verdict"] in ("speculate", "off") and scenario["best_k"] in (1, 2, 4)
        plain, *speculative = scenario["per_k"]
        assert plain["k"] == 0 and plain["rounds"] == plain["new_tokens"] and plain["speedup"] == 1.0
        for entry in speculative:
            assert entry["alpha"] == 1.0 and entry["per_position"] == [1.0] * entry["k"]
            assert entry["new_tokens"] == plain["new_tokens"]
            assert entry["rounds"] == math.ceil(plain["new_tokens"] / (entry["k"] + 1))
            assert set(entry) >= {"predicted_speedup", "verify_cost", "c", "draft_s_per_token", "tokens_per_s"}
    written = read_profiles(profile)["self"]
    assert set(written.scenarios) == {"code", "chat"} and written.overall is not None
    assert written.scenarios["code"].alpha == 1.0 and set(written.scenarios["code"].verify_cost) == {1, 2, 4}
    assert written.scenarios["chat"].k == report["scenarios"]["chat"]["k"]
    assert {"torch", "transformers", "target", "draft"} <= set(written.versions)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [(["--prompts", "nowhere.jsonl"], "prompt file not found"),
     (["--k", "0..x"], "--k takes a range"),
     (["--pair", "nope"], "unknown pair 'nope'"),
     (["--write", "--profile", "{bad}"], "not valid YAML")],
)
def test_bad_input_is_one_line_and_exit_code_2(models_file, tmp_path, args, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pairs: [unclosed\n")
    args = [a.replace("{bad}", str(bad)) for a in args]
    if "--prompts" not in args:
        args += ["--prompts", str(models_file.parent / "prompts.jsonl")]
    result = invoke("calibrate-k", "--models", str(models_file), *args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert bad.read_text() == "pairs: [unclosed\n"


# --- profile files --------------------------------------------------------------------------------


NGRAM_IDENTITY = {"kind": "ngram", "lookup": False, "source": "ngram 1-3"}


def sample_profile(name="self", code_k=4, target="t", draft="ngram", drafter=None):
    code = ScenarioProfile(k=code_k, verdict="speculate", best_k=code_k, speedup=1.7, alpha=0.81, c=0.002,
                           verify_cost={1: 1.14, 2: 1.2, 4: 1.57})
    off = ScenarioProfile(k=0, verdict="off", best_k=2, speedup=0.93, alpha=0.07, c=0.002, verify_cost={1: 1.1, 2: 1.2})
    return PairProfile(name, "2025-01-01T00:00:00+00:00", target, draft, {"code": code, "creative": off}, overall=code,
                       versions={"torch": "2.13"}, settings={"max_new_tokens": 128, "k": "0..8"},
                       drafter=drafter or NGRAM_IDENTITY)


def test_a_profile_written_and_read_back_equals_itself(tmp_path):
    path = tmp_path / "sub" / "profile.yaml"
    write_profile(path, sample_profile())
    assert read_profiles(path) == {"self": sample_profile()}
    assert path.stat().st_mode & 0o777 == 0o666 & ~current_umask()  # not the temporary file's 0600


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_interrupted_write_leaves_the_old_profile_intact(tmp_path, monkeypatch):
    path = tmp_path / "profile.yaml"
    write_profile(path, sample_profile(code_k=4))
    before = path.read_bytes()

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        write_profile(path, sample_profile(code_k=7))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["profile.yaml"]  # no temporary file left behind


def test_writing_one_pair_keeps_comments_and_the_other_pairs(tmp_path):
    path = tmp_path / "profile.yaml"
    write_profile(path, sample_profile("other"))
    path.write_text("# my notes: keep me\n" + path.read_text().replace("alpha: 0.07", "alpha: 0.07  # looked low"))
    write_profile(path, sample_profile("self", code_k=6))
    write_profile(path, sample_profile("self", code_k=5))
    text = path.read_text()
    assert "# my notes: keep me" in text and "# looked low" in text
    profiles = read_profiles(path)
    assert profiles["other"] == sample_profile("other")
    assert profiles["self"].scenarios["code"].k == 5


def test_a_pair_can_name_its_profile_relative_to_models_yaml(models_file):
    registry = load_registry(models_file)
    assert registry.pair("listed").profile == models_file.parent / "profiles" / "listed.yaml"
    assert registry.pair("self").profile is None


def test_a_profile_calibrated_with_another_drafter_is_ignored_and_the_profile_names_its_head(models_file, tmp_path, pair_dir):
    """The default pair's shape (a head after prompt lookup): a profile written with `--drafter ngram`
    must not seed it, nor the other way round; the one written with the head names the head's hash."""
    path = tmp_path / "profile.yaml"
    common = ["calibrate-k", "--models", str(models_file), "--pair", "lookup-head", "--prompts",
              str(models_file.parent / "prompts.jsonl"), "--k", "0,1", "--max-new-tokens", "4", "--raw", "--json",
              "--write", "--profile", str(path)]
    assert invoke(*common, "--drafter", "ngram").exit_code == 0
    written = read_profiles(path)["lookup-head"]
    assert written.drafter == {"kind": "ngram", "lookup": False, "source": "ngram 1-3"}

    run = invoke("generate", "abc", "--models", str(models_file), "--pair", "lookup-head", "--profile", str(path),
                 "-k", "auto", "--max-new-tokens", "3", "--raw", "--json")
    assert run.exit_code == 0, run.output
    assert run.stderr == (f"specdec: warning: {path}: ignoring the profile of 'lookup-head': calibrated with another "
                          f"drafter: 'ngram 1-3' then, 'head {pair_dir / 'head'} (sha256 {head_hash(pair_dir / 'head')}) "
                          "after prompt lookup' now\n")
    stats = json.loads(run.stdout.splitlines()[-1])["stats"]
    assert stats["k_start"] == 2 and stats["profile"] is None  # the pair's K, not the n-gram profile's

    assert invoke(*common).exit_code == 0  # now calibrated with the default drafter itself
    written = read_profiles(path)["lookup-head"]
    assert written.drafter["kind"] == "head" and written.drafter["lookup"] is True
    assert written.drafter["sha256"] == head_hash(pair_dir / "head") != "missing"
    run = invoke("generate", "abc", "--models", str(models_file), "--pair", "lookup-head", "--profile", str(path),
                 "-k", "auto", "--max-new-tokens", "3", "--raw", "--json")
    assert run.stderr == "" and json.loads(run.stdout.splitlines()[-1])["stats"]["profile"] == str(path)
    run = invoke("generate", "abc", "--models", str(models_file), "--pair", "lookup-head", "--profile", str(path),
                 "-k", "auto", "--max-new-tokens", "3", "--raw")
    assert f"specdec: auto starts from profile {path} (pair 'lookup-head'" in run.stderr
    run = invoke("generate", "abc", "--models", str(models_file), "--pair", "lookup-head", "--drafter", "ngram",
                 "--profile", str(path), "-k", "auto", "--max-new-tokens", "3", "--raw", "--json")
    assert "calibrated with another drafter: 'head" in run.stderr  # and the other way round


# --- hot reload -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rewrite", [True, False])
def test_a_profile_rewritten_between_prompts_changes_the_k_of_the_next(models_file, tmp_path, monkeypatch, capsys, rewrite):
    from specdec_cli.commands.generate import generate

    pair = load_registry(models_file).pair("self")
    path = tmp_path / "profile.yaml"
    write_profile(path, sample_profile("self", code_k=2, target=str(pair.target.source), draft=str(pair.target.source),
                                          drafter=drafter_identity(pair)))

    def lines():  # stdin that rewrites the profile after the first prompt was read and answered
        yield '{"id": 1, "scenario": "code", "prompt": "abc"}\n'
        if rewrite:
            write_profile(path, sample_profile("self", code_k=6, target=str(pair.target.source), draft=str(pair.target.source),
                                          drafter=drafter_identity(pair)))
        yield '{"id": 2, "scenario": "code", "prompt": "abd"}\n'

    monkeypatch.setattr(sys, "stdin", lines())
    generate(prompt="-", models=str(models_file), profile=str(path), max_new_tokens=6, raw=True, json_lines=True)
    first, second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert first["stats"]["k"] == "auto" and first["stats"]["k_start"] == 2
    # Rewritten: the new profile's K. Unchanged: the scenario's controller carries on (not K=6).
    assert (second["stats"]["k_start"] == 6) == rewrite
    assert first["token_ids"] == greedy_ids(models_file, "abc", 6)


def test_a_profile_that_appears_while_running_turns_on_adaptive_k(models_file, tmp_path, monkeypatch, capsys):
    from specdec_cli.commands.generate import generate

    pair = load_registry(models_file).pair("self")
    monkeypatch.setenv("SPECDEC_PROFILE", str(tmp_path / "later.yaml"))  # the default location, empty so far

    def lines():
        yield '{"id": 1, "scenario": "code", "prompt": "abc"}\n'
        write_profile(tmp_path / "later.yaml", sample_profile("self", code_k=5, target=str(pair.target.source),
                                                              draft=str(pair.target.source), drafter=drafter_identity(pair)))
        yield '{"id": 2, "scenario": "code", "prompt": "abd"}\n'

    monkeypatch.setattr(sys, "stdin", lines())
    generate(prompt="-", models=str(models_file), max_new_tokens=4, raw=True, json_lines=True)
    first, second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert first["stats"]["k"] == 3 and "rounds_off" not in first["stats"]  # no profile yet: the pair's K
    assert second["stats"]["k"] == "auto" and second["stats"]["k_start"] == 5


def greedy_ids(models_file, text, n):
    from specdec_cli.decoding.loaded_pair import load_pair

    runtime = load_pair(load_registry(models_file).pair("self"))
    ids = runtime.tokenizer(text)["input_ids"]
    return [t for e in runtime.engine.generate(ids, k=0, max_new_tokens=n) for t in e.emitted]
