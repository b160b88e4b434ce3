"""Trees on the command line: generate --tree, bench's tree modes, verify-equivalence --tree."""

import json

from typer.testing import CliRunner

from specdec_cli.cli import app

runner = CliRunner()


def invoke(pair_dir, *args):
    return runner.invoke(app, [*args[:1], "--models", str(pair_dir / "models.yaml"), *args[1:]])


def test_generate_tree_gives_plain_decodings_tokens_and_reports_nodes(pair_dir):
    def run(*options):
        result = invoke(pair_dir, "generate", "--pair", "tiny-alt", "--drafter", "head", "--max-new-tokens", "12",
                        "--json", *options, "abcabcabc")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout.splitlines()[0])

    tree, plain = run("--tree", "6"), run("-k", "0")
    assert tree["token_ids"] == plain["token_ids"]
    assert tree["stats"]["tree"] == 6 and 0 < tree["stats"]["mean_nodes_verified"] <= 6
    assert "tree" not in plain["stats"]


def test_tree_options_refuse_what_they_cannot_do(pair_dir):
    both = invoke(pair_dir, "generate", "--pair", "tiny-alt", "--drafter", "head", "--tree", "4", "-k", "3", "hi")
    assert both.exit_code == 2 and "specdec: error: -k drafts a chain and --tree a tree: give one of them" in both.output
    ngram = invoke(pair_dir, "generate", "--pair", "tiny-alt", "--tree", "4", "hi")
    assert ngram.exit_code == 2 and "--tree needs a draft head, and pair 'tiny-alt' drafts with 'ngram'" in ngram.output
    zero = invoke(pair_dir, "generate", "--pair", "tiny-alt", "--drafter", "head", "--tree", "0", "hi")
    assert zero.exit_code == 2 and "--tree must be from 1 to 32, got 0" in zero.output


def test_bench_tree_modes_match_plain_and_report_the_budget(pair_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "abcabcabc", "scenario": "code"}\n{"prompt": "hello there", "scenario": "chat"}\n')
    result = invoke(pair_dir, "bench", "--pair", "tiny-alt", "--prompts", str(prompts), "--max-new-tokens", "10",
                    "--json", "--modes", "plain,head:2,tree:4,ngram+tree:6")
    assert result.exit_code == 0, result.output
    modes = json.loads(result.stdout)["modes"]
    assert all(figures["identical_to_plain"] for figures in modes.values())
    assert modes["tree:4"]["tree_budget"] == 4 and 0 < modes["tree:4"]["mean_nodes"] <= 4
    assert modes["ngram+tree:6"]["tree_budget"] == 6 and "tree_budget" not in modes["head:2"]


def test_verify_equivalence_checks_tree_budgets(pair_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "abcabcabc"}\n{"prompt": "hello"}\n')
    result = invoke(pair_dir, "verify-equivalence", "--pair", "tiny-alt", "--drafter", "head", "--prompts", str(prompts),
                    "--max-new-tokens", "10", "--tree", "3,8", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["equivalent"] and report["tree"] and report["drafter"] == "head-tree"
    bad = invoke(pair_dir, "verify-equivalence", "--pair", "tiny-alt", "--prompts", str(prompts), "--tree", "0")
    assert bad.exit_code == 2 and "--tree '0': each must be from 1 to 32, got 0" in bad.output
