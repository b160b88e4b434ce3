"""No output option overwrites a file specdec did not write (issue 65, case 2, beyond --memory): a notes
file, a JSON config or a model directory named by mistake is refused with one line before any work and
left byte for byte as it was; a file specdec wrote earlier, an empty one or a new name is written as
before. The rule is atomic.check_writable's; each command names its recogniser (commands/own_files.py)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import one_line_error
from typer.testing import CliRunner

from specdec_cli import atomic
from specdec_cli.commands import own_files
from specdec_cli.cli import app
from specdec_cli.errors import UserError
from specdec_cli.export import engines
from specdec_cli.export.llama_flags import LlamaFlags
from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, drafter_identity, write_profile
from specdec_cli.pairs.registry import load_registry

runner = CliRunner()
NOTES = "my notes: do not lose these\n"
URL = "http://127.0.0.1:9"  # never contacted: the refusal comes first


def refused(option: str, path, directory: bool = False) -> str:
    if directory:
        return (f"{option} {path}: not empty and not a directory specdec wrote, so it is left alone; "
                "give another name or empty it")
    return f"{option} {path}: not a file specdec wrote, so it is left alone; give another name or delete it"


# Every file option of every command, each with a pair that does not exist: had a model (or the pair)
# been looked for first, that would be the error.
FILE_CASES = [
    pytest.param(["verify-equivalence", "--prompts", "{prompts}", "--report", "{path}"], "--report", id="verify"),
    pytest.param(["verify-equivalence", "--server", URL, "--reference", URL, "--prompts", "{prompts}", "--report",
                  "{path}"], "--report", id="verify-server"),
    pytest.param(["bench", "--prompts", "{prompts}", "--markdown", "{path}"], "--markdown", id="bench-markdown"),
    pytest.param(["bench", "--server", URL, "--prompts", "{prompts}", "--markdown", "{path}"], "--markdown",
                 id="bench-server-markdown"),
    pytest.param(["bench", "--server", URL, "--prompts", "{prompts}", "--plot", "{path}"], "--plot",
                 id="bench-server-plot"),
    pytest.param(["calibrate-k", "--prompts", "{prompts}", "--plot", "{path}"], "--plot", id="calibrate-plot"),
    pytest.param(["export", "--engine", "vllm", "--out", "{path}"], "--out", id="export-vllm"),
    pytest.param(["export", "--engine", "transformers", "--out", "{path}"], "--out", id="export-transformers"),
]


@pytest.mark.parametrize("args, option", FILE_CASES)
def test_a_foreign_file_at_an_output_is_refused_before_any_work_and_left_alone(models, tmp_path, args, option):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    notes = tmp_path / "notes.txt"
    notes.write_text(NOTES)
    before = notes.stat().st_mtime_ns
    args = [a.format(prompts=prompts, path=notes) for a in args]
    message = one_line_error(runner.invoke(app, args + ["--models", models, "--pair", "missing"]))
    assert message == refused(option, notes)
    assert notes.read_text() == NOTES and notes.stat().st_mtime_ns == before
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "p.txt"]  # no temp file, no probe left


def test_a_foreign_profile_is_refused_before_the_pair_loads(models, tmp_path):
    """The profile's path can depend on the pair (its `profile:` key), so the pair is looked up first
    (reading models.yaml, no model); the model would load after the check."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    for text in (NOTES, "# a comment only\n", '{"pair": "x"}\n'):
        path = tmp_path / "profile.yaml"
        path.write_text(text)
        result = runner.invoke(app, ["calibrate-k", "--models", models, "--prompts", str(prompts), "--write",
                                     "--profile", str(path)])
        assert one_line_error(result) == refused("--profile", path), text
        assert path.read_text() == text


def test_the_prompts_file_itself_is_not_taken_for_a_report(models, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text('{"prompt": "hello", "id": 1}\n')
    result = runner.invoke(app, ["verify-equivalence", "--models", models, "--prompts", str(prompts),
                                 "--report", str(prompts)])
    assert one_line_error(result) == refused("--report", prompts)
    assert prompts.read_text() == '{"prompt": "hello", "id": 1}\n'


def test_a_model_directory_is_not_taken_for_an_output_directory(models, pair_dir, tmp_path):
    """export-head and train-draft write config.json and weights into --out: a user's model directory
    named there would lose its own."""
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}\n')
    (model / "model.safetensors").write_bytes(b"weights")
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    cases = [
        (["export-head", str(pair_dir / "head"), "--out", str(model)]),
        (["train-draft", "--models", models, "--pair", "missing", "--prompts", str(prompts), "--kind", "head",
          "--steps", "1", "--out", str(model)]),
    ]
    for args in cases:
        assert one_line_error(runner.invoke(app, args)) == refused("--out", model, directory=True), args
    assert sorted(os.listdir(model)) == ["config.json", "model.safetensors"]
    assert (model / "model.safetensors").read_bytes() == b"weights"


def test_a_symlink_to_a_foreign_file_is_refused_and_both_kept(models, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(NOTES)
    link = tmp_path / "report.json"
    link.symlink_to(notes)
    result = runner.invoke(app, ["export", "--engine", "vllm", "--models", models, "--pair", "missing",
                                 "--out", str(link)])
    assert one_line_error(result) == refused("--out", link)
    assert link.is_symlink() and notes.read_text() == NOTES


# --- what specdec wrote is written again -----------------------------------------------------------


@pytest.fixture
def profile(pair_dir, tmp_path):
    """A profile for the tiny pair, written by the profile writer: export reads it, loads no model."""
    pair = load_registry(pair_dir / "models.yaml").pair("tiny")
    scenario = ScenarioProfile(k=3, verdict="speculate", best_k=3, speedup=1.5, alpha=0.7, c=0.1, verify_cost={3: 1.2})
    path = tmp_path / "profile.yaml"
    write_profile(path, PairProfile(pair="tiny", calibrated="2026-12-01T09:00:00+00:00", target=str(pair.target.source),
                                    draft="draft", scenarios={"default": scenario}, drafter=drafter_identity(pair)))
    return path


def export(models, profile, engine, out):
    return runner.invoke(app, ["export", "--engine", engine, "--models", models, "--pair", "tiny",
                               "--profile", str(profile), "--out", str(out)])


def test_an_export_replaces_its_own_earlier_file_and_an_empty_one(models, profile, tmp_path):
    out = tmp_path / "spec.json"
    out.write_text("")
    assert export(models, profile, "vllm", out).exit_code == 0
    first = out.read_text()
    out.write_text(first.replace('"num_speculative_tokens": 3', '"num_speculative_tokens": 9'))
    for engine in ("vllm", "llama.cpp", "transformers", "vllm"):  # each engine's file replaces another's
        result = export(models, profile, engine, out)
        assert result.exit_code == 0, result.output
    assert out.read_text() == first


def test_a_report_verify_wrote_is_written_again(models, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabc\n")
    report = tmp_path / "r.json"
    args = ["verify-equivalence", "--models", models, "--prompts", str(prompts), "-k", "2", "--max-new-tokens", "4",
            "--json", "--report", str(report)]
    assert runner.invoke(app, args).exit_code == 0
    report.write_text(report.read_text().replace('"equivalent": true', '"equivalent": false'))
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["equivalent"] is True


def test_a_models_own_generation_config_is_left_alone(models, profile, pair_dir, tmp_path):
    """`export --engine transformers --out DIR/generation_config.json` into the model's directory: the
    model's own file (transformers wrote it, with its token ids) is not specdec's."""
    out = tmp_path / "generation_config.json"
    own = json.dumps({"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1,
                      "transformers_version": "4.57.1"}, indent=2) + "\n"
    out.write_text(own)
    assert one_line_error(export(models, profile, "transformers", out)) == refused("--out", out)
    assert out.read_text() == own


def test_an_unfinished_training_run_is_recognised_and_goes_on_to_its_own_check(models, tmp_path):
    """A directory holding a checkpoint is train-draft's: the refusal there is draft_job's (--resume)."""
    out = tmp_path / "run"
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "data.pt").write_bytes(b"not read")
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    result = runner.invoke(app, ["train-draft", "--models", models, "--pair", "tiny", "--prompts", str(prompts),
                                 "--kind", "head", "--steps", "1", "--out", str(out)])
    assert one_line_error(result) == f"{out} holds a checkpoint: pass --resume to continue it, or choose another --out"


# --- the recognisers ------------------------------------------------------------------------------


def test_check_writable_takes_a_new_name_an_empty_file_and_its_own(tmp_path):
    path = tmp_path / "r.json"
    assert atomic.check_writable(path, "--report", ours=own_files.verify_report) == path
    path.write_text("")
    atomic.check_writable(path, "--report", ours=own_files.verify_report)
    path.write_text(json.dumps({"pair": "tiny", "equivalent": True, "verdict": "equivalent", "rows": []}, indent=2))
    atomic.check_writable(path, "--report", ours=own_files.verify_report)
    path.write_text(NOTES)
    with pytest.raises(UserError, match="not a file specdec wrote"):
        atomic.check_writable(path, "--report", ours=own_files.verify_report)
    empty = tmp_path / "empty"
    empty.mkdir()
    atomic.check_writable(empty, "--out", directory=True, ours=own_files.eagle3_export)


def test_an_unreadable_file_cannot_be_recognised(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text('{"pair": "tiny", "equivalent": true, "verdict": "equivalent"}')

    def unreadable(target):
        raise PermissionError(13, "Permission denied")

    assert atomic.foreign(path, False, unreadable)
    assert not atomic.foreign(path, False, own_files.verify_report)


def test_verify_reports(tmp_path):
    path = tmp_path / "r.json"
    cases = [('{"pair": "p", "speculative": "s", "levels": {}, "equivalent": false, "verdict": "v"}', True),
             ('{"pair": "p", "equivalent": true}', False),
             ('["pair", "equivalent", "verdict"]', False),
             ("[" * 200_000, False),  # nested past the parser's recursion: not a traceback
             (NOTES, False)]
    for text, ours in cases:
        path.write_text(text)
        assert own_files.verify_report(path) is ours, text[:40]


def plans():
    model = engines.EngineDrafter("model", "/models/draft")
    head = engines.EngineDrafter("head", "/models/eagle3")
    ngram = engines.EngineDrafter("ngram")
    return [engines.ExportPlan("p", "/models/t", model, 3, "origin"),
            engines.ExportPlan("p", "/models/t", ngram, 4, "origin", table=[[1, 4, 4], [5, 16, 0]]),
            engines.ExportPlan("p", "/models/t", model, 0, "origin"),
            engines.ExportPlan("p", "/models/t", head, 3, "origin", scenario_ks={"code": 5, "chat": 2}),
            engines.ExportPlan("p", "/models/t.gguf", ngram, 2, "origin")]


def test_every_engines_export_is_recognised(tmp_path):
    path = tmp_path / "out"
    artifacts = [engines.build(engine, plan, LlamaFlags.documented(), str(path))
                 for engine in engines.ENGINES for plan in plans()]
    assert {a.artifact_kind for a in artifacts} >= {"vLLM --speculative-config JSON", "SGLang launch command",
                                                    "SGLang --speculative-adaptive-config JSON",
                                                    "llama-server command line", "transformers generation_config.json"}
    for artifact in artifacts:
        path.write_text(artifact.artifact)
        assert own_files.engine_config(path), artifact.artifact


@pytest.mark.parametrize("text", [
    NOTES,
    '{"model_type": "llama", "num_speculative_tokens": 3}\n',  # a model's config.json
    "llama-server -m t.gguf\nrm -rf /\n",  # a script that starts like the line
    "#!/bin/sh\nllama-server -m t.gguf\n",
])
def test_other_files_are_not_engine_configs(tmp_path, text):
    path = tmp_path / "out"
    path.write_text(text)
    assert not own_files.engine_config(path)


def test_bench_pages_are_recognised_and_other_markdown_is_not(tmp_path):
    from specdec_cli.commands import bench, engine_bench

    manifest = {"command": "specdec bench --markdown b.md", "date": "2026-12-01T09:00:00+00:00"}
    loop = bench.markdown_page({"manifest": manifest, "modes": {}, "scenarios": {}, "lossy": {}})
    served = engine_bench.markdown_page({"manifest": manifest, "levels": [], "modes": {}, "gain": {},
                                         "plain": "vllm-plain", "crossover": {}, "k_table": {}})
    path = tmp_path / "b.md"
    for text, ours in ((loop, True), (served, True), ("# Benchmark\n\nMy own notes.\n", False),
                       ("# Notes\n\nMade with `specdec bench`\n", False), (NOTES, False)):
        path.write_text(text)
        assert own_files.markdown_page(path) is ours, text


@pytest.mark.parametrize("suffix", ["png", "svg", "pdf"])
def test_plots_are_recognised(tmp_path, suffix):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdec_cli.measure.plot import save_figure

    figure, axes = plt.subplots()
    axes.plot([1, 2], [3, 4])
    path = tmp_path / f"plot.{suffix}"
    save_figure(figure, path)
    assert own_files.image(path)
    path.write_text(NOTES)
    assert not own_files.image(path)


def test_profiles_are_recognised(tmp_path):
    path = tmp_path / "profile.yaml"
    scenario = ScenarioProfile(k=3, verdict="speculate", best_k=3, speedup=1.5, alpha=0.7, c=0.1, verify_cost={3: 1.2})
    write_profile(path, PairProfile(pair="p", calibrated="2026-12-01", target="t", draft="d",
                                    scenarios={"s": scenario}))
    assert own_files.profile(path)
    for text in (NOTES, "# comments only\n", "default: tiny\n", '{"pairs": {}}\n'):
        path.write_text(text)
        assert not own_files.profile(path), text


def test_training_and_export_directories(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    assert not own_files.training_run(run)  # an empty checkpoint directory says nothing
    (run / "checkpoint" / "state.pt.partial").write_bytes(b"")
    assert own_files.training_run(run)
    done = tmp_path / "done"
    done.mkdir()
    (done / "specdec-draft.json").write_text("{}")
    assert own_files.training_run(done) and not own_files.eagle3_export(done)
    exported = tmp_path / "eagle3"
    exported.mkdir()
    (exported / "specdec-export.json").write_text("{}")
    assert own_files.eagle3_export(exported) and not own_files.training_run(exported)
