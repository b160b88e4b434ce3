"""`specdec bench --batch N,N,...` on the tiny pair: every mode at every batch size gives each prompt its
plain decoding's tokens at batch 1, the figures (gain, K table, break-even size, percentiles) are
serving/stats.py's on the jobs' numbers, and what --batch cannot measure is refused in one line."""

from __future__ import annotations

import json

import pytest
from conftest import one_line_error
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.measure.batch_figures import Job, differing, fixed_k, markdown_section, report, summary_lines
from specdec_cli.measure.loop_bench import Mode
from specdec_cli.serving.stats import crossover

runner = CliRunner()
PROMPTS = ["abcabcabc", "hello there", "the fourth one runs on", "xyzxyz", "fifth and last"]


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def bench(models, prompt_file, *extra):
    return runner.invoke(app, ["bench", "--models", models, "--prompts", str(prompt_file), "--max-new-tokens", "10",
                               *extra])


def test_bench_batch_reports_each_size_and_mode_with_every_answer_plains(models, prompt_file, tmp_path):
    page = tmp_path / "page.md"
    result = bench(models, prompt_file, "--dtype", "int8", "--batch", "4,2", "--modes", "plain,ngram:3,auto", "--json",
                   "--markdown", str(page))
    assert result.exit_code == 0, result.output
    report_ = json.loads(result.stdout)
    assert "modes" not in report_ and report_["manifest"]["batch_sizes"] == [1, 2, 4]  # 1 always: the reference
    batch = report_["batch"]
    assert batch["sizes"] == [1, 2, 4] and list(batch["by_size"]) == ["1", "2", "4"]
    for size, by_mode in batch["by_size"].items():
        assert list(by_mode) == ["plain", "ngram:3", "auto"]
        assert all(figures["identical_to_plain"] is True for figures in by_mode.values()), size
        assert by_mode["plain"]["gain"] == 1.0 and by_mode["plain"]["alpha"] is None
        assert by_mode["plain"]["mean_tokens_per_round"] == 1.0
        assert by_mode["ngram:3"]["alpha"] is not None
        for figures in by_mode.values():
            assert figures["p50_latency_s"] <= figures["p90_latency_s"] <= figures["p99_latency_s"]
            assert figures["new_tokens"] == batch["by_size"]["1"]["plain"]["new_tokens"]
            assert figures["max_at_once"] == int(size)  # the job reached its batch size
    assert batch["by_size"]["1"]["plain"]["vs_plain_batch_1"] == 1.0
    rows = batch["k_by_batch_size"]  # ngram:3 alone is fixed-K: K 3 or 0 from batch 1 to 4
    assert rows[0][0] == 1 and rows[-1][1] == 4 and all(k in (0, 3) for _, _, k in rows)
    assert set(batch["break_even_batch"]) == {"ngram:3", "auto"}
    text = page.read_text()
    assert "## Batch sizes" in text and "| 4 | auto |" in text and "## Manifest" in text


def test_every_mode_at_batch_four_gives_each_prompt_its_batch_one_tokens(models):
    """The jobs' own tokens, prompt by prompt: a batched mode whose tokens moved fails here."""
    from specdec_cli.commands.common import resolve_pair
    from specdec_cli.decoding.loaded_pair import load_pair
    from specdec_cli.measure import batch_bench
    from specdec_cli.measure.loop_bench import Bench
    from specdec_cli.pairs.tokenization import encode_prompt
    from specdec_cli.prompts import Prompt

    runtime = load_pair(resolve_pair(models, "tiny-alt", None, None, dtype="int8"))
    prompts = [Prompt(i, text) for i, text in enumerate(PROMPTS)]
    encoded = [encode_prompt(runtime.tokenizer, p.text) for p in prompts]
    modes = [Mode("plain"), Mode("ngram", 3), Mode("spec", 2), Mode("head", 2), Mode("auto")]
    jobs = batch_bench.run(Bench(runtime, 12), modes, prompts, encoded, [1, 4])
    alone = jobs[1][Mode("plain")].tokens
    assert len(alone) == len(PROMPTS) and all(alone)
    for mode in modes:
        assert jobs[4][mode].tokens == jobs[1][mode].tokens == alone, mode
        assert len(jobs[4][mode].latencies_s) == len(PROMPTS)
        assert (jobs[1][mode].at_once, jobs[4][mode].at_once) == (1, 4)  # batched indeed
    assert jobs[4][Mode("spec", 2)].drafted > 0


TOKENS = [[5, 6], [7]]  # 3 new tokens a job


def job(tokens_per_s: float, tokens=TOKENS, **counts) -> Job:
    return Job(tokens, [0.1, 0.3], 3 / tokens_per_s, **counts)


def test_figures_are_the_gain_k_table_and_break_even_of_the_jobs_numbers():
    sizes = [1, 2, 4]
    plain = [1.0, 2.0, 3.0]  # tokens/s at each size
    gains = {"ngram:3": [2.0, 1.5, 0.6], "spec:3": [1.2, 1.8, 0.9], "head:2": [1.1, 1.7, 1.2], "auto": [1.3, 1.0, 0.8]}
    jobs = {size: {"plain": job(plain[i], rounds=3)} for i, size in enumerate(sizes)}
    for mode, values in gains.items():
        for i, size in enumerate(sizes):
            jobs[size][mode] = job(plain[i] * values[i], rounds=2, drafted=4, accepted=1, judged=2)
    jobs[4]["spec:3"] = job(3 * 0.9, tokens=[[5, 6], [8]], rounds=2, drafted=4, accepted=1, judged=2)
    fixed = fixed_k([Mode("plain"), Mode("ngram", 3), Mode("spec", 3), Mode("head", 2), Mode("auto"), Mode("tree", 8)])
    assert fixed == {"ngram:3": 3, "spec:3": 3, "head:2": 2}
    batch = report(sizes, jobs, fixed)
    by_size = batch["by_size"]
    assert [by_size[str(s)]["plain"]["gain"] for s in sizes] == [1.0, 1.0, 1.0]
    assert [by_size[str(s)]["ngram:3"]["gain"] for s in sizes] == [2.0, 1.5, 0.6]
    assert [by_size[str(s)]["plain"]["vs_plain_batch_1"] for s in sizes] == [1.0, 2.0, 3.0]
    assert by_size["2"]["ngram:3"]["vs_plain_batch_1"] == 3.0 and by_size["2"]["ngram:3"]["tokens_per_s"] == 3.0
    # K 3's best at batch 2 is spec:3's 1.8, above head:2's 1.7 (ngram:3's 1.5 alone would lose to it)
    assert batch["k_by_batch_size"] == [[1, 3, 3], [4, 4, 2]]
    assert batch["break_even_batch"] == {"ngram:3": crossover(sizes, [2.0, 1.5, 0.6]), "spec:3": crossover(sizes, [1.2, 1.8, 0.9]),
                                         "head:2": None, "auto": 2.0}
    assert batch["break_even_batch"]["ngram:3"] == pytest.approx(3.111, abs=1e-3)
    figures = by_size["4"]["ngram:3"]
    assert (figures["p50_latency_s"], figures["p90_latency_s"], figures["p99_latency_s"]) == (0.2, 0.28, 0.298)
    assert figures["alpha"] == 0.5 and figures["mean_tokens_per_round"] == 1.5 and figures["mean_drafted"] == 2.0
    assert by_size["4"]["spec:3"]["identical_to_plain"] is False and differing(batch) == ["spec:3"]
    assert by_size["1"]["plain"]["alpha"] is None and by_size["1"]["plain"]["mean_tokens_per_round"] == 1.0
    lines = summary_lines(batch)
    assert "head:2: the gain stays at or above 1 at every batch size measured" in lines
    assert "auto: the gain falls below 1 at batch 2" in lines
    assert lines[-1] == "K by batch size (fixed-K modes; vLLM's num_speculative_tokens_per_batch_size): [[1, 3, 3], [4, 4, 2]]"
    assert "| 4 | spec:3 | 2.70 | 0.90 | 2.70 | 0.20 | 0.28 | 0.30 | 1.50 | 0.50 | 2.00 | NO |" in markdown_section(batch)
    assert report(sizes, {s: {"plain": jobs[s]["plain"], "auto": jobs[s]["auto"]} for s in sizes}, {})["k_by_batch_size"] is None


LEAN = "decoding 2 prompts at once needs specdec's lean forward (Llama-architecture targets on int8/int4 kernels); " \
       "this target runs transformers' forward, one prompt at a time"


@pytest.mark.parametrize("options, message", [
    (("--engine", "llama.cpp", "--batch", "2"),
     "--batch measures this loop's batches; a serving engine's bench takes --concurrency N,N,..."),
    (("--modes", "plain,hf-plain", "--batch", "2"),
     "--batch measures this loop's modes; hf-plain is transformers' generate, which bench runs one prompt at a time"),
    (("--batch", "0"), "--batch must be at least 1, got 0"),
    (("--batch", "2,65"), "--batch must be at most 64, got 65"),
    (("--batch", "x"), "--batch 'x': expected comma-separated batch sizes, as in 1,2,4,8,16"),
    (("--batch", "1,,2"), "--batch '1,,2': expected comma-separated batch sizes, as in 1,2,4,8,16"),
    (("--samples", "2", "--batch", "2"),
     "--batch runs every prompt once per mode and batch size; --samples 2 applies to the bench without --batch"),
    (("--accept", "top:3", "--batch", "2"),
     "--batch measures lossless modes, each checked against plain decoding at batch 1; --accept top:3 is lossy"),
    (("--modes", "plain,spec:3@top:3", "--batch", "2"),
     "--batch measures lossless modes, each checked against plain decoding at batch 1; mode spec:3@top:3 is lossy"),
    (("--modes", "plain,ngram:3", "--batch", "1,2"), LEAN),  # float32: transformers' forward
])
def test_what_batch_cannot_measure_is_refused_in_one_line(models, prompt_file, options, message):
    assert one_line_error(bench(models, prompt_file, *options)) == message


def calibrate(models, prompt_file, *extra):
    return runner.invoke(app, ["calibrate-k", "--models", models, "--prompts", str(prompt_file), "--max-new-tokens",
                               "10", *extra])


def test_calibrate_k_batch_measures_the_pairs_drafter_at_each_k_and_keeps_the_k_table(models, prompt_file, tmp_path):
    from specdec_cli.pairs.profile import read_profiles

    profile = tmp_path / "profile.yaml"
    result = calibrate(models, prompt_file, "--dtype", "int8", "--k", "0,2,3", "--batch", "2", "--json", "--write",
                       "--profile", str(profile))
    assert result.exit_code == 0, result.output
    batch = json.loads(result.stdout)["batch"]
    assert batch["sizes"] == [1, 2]
    for size, by_mode in batch["by_size"].items():
        assert list(by_mode) == ["plain", "spec:2", "spec:3"]  # the tiny pair drafts with its draft model
        assert all(figures["identical_to_plain"] is True for figures in by_mode.values()), size
        assert all(figures["max_at_once"] == int(size) for figures in by_mode.values())
    rows = batch["k_by_batch_size"]
    assert rows[0][0] == 1 and rows[-1][1] == 2 and all(k in (0, 2, 3) for _, _, k in rows)
    assert set(batch["break_even_batch"]) == {"spec:2", "spec:3"}
    [kept] = [section.settings["batch"] for section in read_profiles(profile).values()]
    assert kept == {"sizes": [1, 2], "k_by_batch_size": rows, "break_even_batch": batch["break_even_batch"]}


def test_calibrate_k_batch_runs_each_drafter_as_its_pair_does():
    from pathlib import Path

    from specdec_cli.commands.calibrate_batch import batch_modes
    from specdec_cli.pairs.registry import DrafterSpec

    def modes(spec, ks):
        return [str(m) for m in batch_modes(spec, ks)]

    assert modes(DrafterSpec(head=Path("h"), lookup=True), [0, 1, 3]) == ["plain", "ngram+head:1", "ngram+head:3"]
    assert modes(DrafterSpec(head=Path("h")), [2]) == ["plain", "head:2"]
    assert modes(DrafterSpec(), [0, 2]) == ["plain", "ngram:2"]
    assert modes(DrafterSpec(free_kind="suffix"), [4]) == ["plain", "suffix:4"]


@pytest.mark.parametrize("options, message", [
    (("--batch", "x"), "--batch 'x': expected comma-separated batch sizes, as in 1,2,4,8,16"),
    (("--batch", "2,65"), "--batch must be at most 64, got 65"),
    (("--accept", "top:3", "--batch", "2"),
     "--batch measures lossless modes, each checked against plain decoding at batch 1; --accept top:3 is lossy"),
    (("--batch", "2"), LEAN),  # float32: transformers' forward, refused before the measuring
])
def test_what_calibrate_k_batch_cannot_measure_is_refused_in_one_line(models, prompt_file, options, message):
    assert one_line_error(calibrate(models, prompt_file, *options)) == message
