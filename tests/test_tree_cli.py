"""Trees on the command line: generate --tree (and a seed that fixes sampled text with or without one),
bench's tree modes, verify-equivalence --tree."""

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


def test_a_seed_fixes_the_sampled_text_at_every_k_drafter_tree_and_thread_count(pair_dir):
    """`generate --temperature 0.8 --seed 3` on the tiny pair: one text with -k 0, 4 and auto, each
    drafter, a tree, one thread and two, and run again; another seed gives another."""
    def ids(*options, seed="3"):
        result = invoke(pair_dir, "generate", "--pair", "tiny-alt", "--max-new-tokens", "16", "--json",
                        "--temperature", "0.8", "--seed", seed, *options, "abcabcabc")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["token_ids"]

    plain = ids("-k", "0")
    runs = [ids("-k", "4"), ids("-k", "auto"), ids("--drafter", "head", "-k", "3"), ids("--drafter", "model", "-k", "4"),
            ids("--drafter", "ngram", "-k", "2"), ids("--drafter", "head", "--tree", "6"), ids("-k", "4", "--threads", "1"),
            ids("-k", "4", "--threads", "2"), ids("-k", "0")]
    assert all(run == plain for run in runs), runs
    assert ids("-k", "0", seed="4") != plain


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


def test_generate_tree_auto_lets_adaptive_k_choose_trees_and_stays_plain(pair_dir):
    def run(*options):
        result = invoke(pair_dir, "generate", "--pair", "tiny-alt", "--drafter", "head", "--max-new-tokens", "16",
                        "--json", *options, "abcabcabc")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout.splitlines()[0])

    auto, plain = run("--tree", "auto"), run("-k", "0")
    assert auto["token_ids"] == plain["token_ids"]
    stats = auto["stats"]
    assert stats["k"] == "auto" and stats["tree"] == "auto" and "mean_nodes_verified" in stats
    assert stats["tree_rounds"] == sum(stats["tree_nodes"].values())
    assert run("-k", "auto", "--tree", "auto")["token_ids"] == plain["token_ids"]
    chain_only = run("-k", "auto")["stats"]
    assert "tree_rounds" not in chain_only and "tree" not in chain_only


def test_tree_auto_refuses_a_fixed_k_and_a_lossy_rule(pair_dir):
    fixed = invoke(pair_dir, "generate", "--pair", "tiny-alt", "--drafter", "head", "--tree", "auto", "-k", "3", "hi")
    assert fixed.exit_code == 2 and "specdec: error: --tree auto lets -k auto choose trees: give -k auto or no -k" in fixed.output
    lossy = invoke(pair_dir, "generate", "--pair", "tiny-alt", "--drafter", "head", "--tree", "auto", "--accept", "top:3", "hi")
    assert lossy.exit_code == 2 and "trees are verified exactly" in lossy.output
    word = invoke(pair_dir, "generate", "--pair", "tiny-alt", "--drafter", "head", "--tree", "wide", "hi")
    assert word.exit_code == 2 and "--tree must be an integer from 1 to 32 or auto, got 'wide'" in word.output


def test_bench_auto_tree_matches_plain_and_counts_its_tree_rounds(pair_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "abcabcabc"}\n{"prompt": "hello there"}\n')
    models = tmp_path / "models.yaml"  # bench runs a pair's own drafter: one drafted by its head, after lookup
    models.write_text(f"pairs:\n  headed:\n    target: {pair_dir / 'target'}\n"
                      f"    draft: {{kind: head, source: {pair_dir / 'head'}, lookup: true}}\n    k: 2\n")
    result = runner.invoke(app, ["bench", "--models", str(models), "--pair", "headed", "--prompts", str(prompts),
                                 "--max-new-tokens", "10", "--json", "--modes", "plain,auto,auto+tree"])
    assert result.exit_code == 0, result.output
    modes = json.loads(result.stdout)["modes"]
    assert modes["auto+tree"]["identical_to_plain"] and modes["auto"]["identical_to_plain"]
    assert "tree_rounds" in modes["auto+tree"] and "tree_rounds" not in modes["auto"]
    ngram = invoke(pair_dir, "bench", "--pair", "tiny-alt", "--prompts", str(prompts), "--modes", "plain,auto+tree")
    assert ngram.exit_code == 2 and "mode auto+tree needs a pair drafted by its head; pair 'tiny-alt' drafts with 'ngram'" in ngram.output


def test_calibrate_k_sweeps_tree_budgets_and_writes_what_they_did(pair_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "abcabcabc", "scenario": "code"}\n{"prompt": "hello there", "scenario": "chat"}\n')
    profile = tmp_path / "profile.yaml"
    result = invoke(pair_dir, "calibrate-k", "--pair", "tiny-alt", "--drafter", "head", "--prompts", str(prompts),
                    "--max-new-tokens", "8", "-k", "0,2", "--tree", "3,6", "--json", "--write", "--profile", str(profile))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["trees"]) == {"code", "chat", "overall"}
    assert [f["budget"] for f in report["trees"]["code"]] == [3, 6]
    assert all(f["rounds"] > 0 and 0 < f["mean_nodes"] <= f["budget"] for f in report["trees"]["overall"])
    from specdec_cli.decoding.control.controller import sibling_prior
    from specdec_cli.pairs.profile import read_profiles

    written = next(iter(read_profiles(profile).values()))
    tree = written.settings["tree"]
    assert tree["budgets"] == [3, 6] and tree["scenarios"]["code"]["best"] in (3, 6)
    assert sibling_prior(written, "code") == tuple(tree["scenarios"]["code"]["siblings"])
    ngram = invoke(pair_dir, "calibrate-k", "--pair", "tiny-alt", "--prompts", str(prompts), "--tree", "3")
    assert ngram.exit_code == 2 and "--tree needs a draft head, and pair 'tiny-alt' drafts with 'ngram'" in ngram.output


def test_a_lossy_rule_is_refused_on_every_mode_that_drafts_trees(pair_dir, tmp_path):
    """`ngram+tree` wraps the head's trees in prompt lookup: the wrapper must not hide them."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "abcabcabc"}\n')
    for modes, extra in (("ngram+tree:6@top:3", ()), ("tree:6@top:3", ()), ("auto+tree@lenient:2", ()),
                         ("head:2,ngram+tree:6", ("--accept", "top:3"))):
        result = invoke(pair_dir, "bench", "--pair", "tiny-alt", "--prompts", str(prompts), "--max-new-tokens", "4",
                        "--json", "--modes", modes, *extra)
        assert result.exit_code == 2, (modes, result.output)
        assert "applies to chains of drafts; trees are verified exactly" in " ".join(result.stderr.split()), modes
        assert result.stdout == ""


def test_the_engine_refuses_a_lossy_rule_for_a_tree_however_it_is_wrapped(target):
    import pytest
    from specdec_cli.decoding.drafters.base import drafts_trees
    from specdec_cli.decoding.drafters.lookup import NgramDrafter
    from specdec_cli.decoding.engine import SpeculativeEngine
    from specdec_cli.decoding.drafters.head import HeadDrafter
    from specdec_cli.decoding.head_network import DraftHead, head_config
    from specdec_cli.decoding.loaded_pair import composed
    from specdec_cli.decoding.rules import parse_rule
    from specdec_cli.errors import UserError

    head = HeadDrafter(DraftHead(head_config(target)), target)
    for lookup in (False, True):
        for beside in ((), (NgramDrafter(),)):
            drafter = composed(head, lookup, tree=True, beside=beside)
            assert drafts_trees(drafter) and drafter.needs.features, drafter.name
            assert drafter.needs.features == head.needs.features == head.head.feature_layers
            engine = SpeculativeEngine(target, drafter, {1})
            with pytest.raises(UserError, match="trees are verified exactly"):
                list(engine.generate([0, 5, 6, 7], k=4, max_new_tokens=4, rule=parse_rule("top:3")))
    chain = composed(head, True, beside=(NgramDrafter(),))  # a chain stays a chain
    assert not drafts_trees(chain) and chain.needs.features
