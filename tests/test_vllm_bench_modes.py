"""The engine bench with a server started from a --speculative-config file (`vllm-config:FILE`, as
`specdec export --out` writes) beside vllm-plain, and specdec's own loop at concurrency 1 after the
servers stop, against REAL vLLM servers; nothing left running."""

from __future__ import annotations

import json

from specdec_cli.serving.server import running_servers

from engine_support import require_vllm, specdec, write_prompts

TIMEOUT = 900


def test_a_config_file_mode_and_the_own_loop_beside_it(tmp_path):
    require_vllm()
    config = tmp_path / "spec.json"
    config.write_text(json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                                  "prompt_lookup_max": 4}))
    mode = f"vllm-config:{config}"
    done = specdec("bench", "--engine", "vllm", "--prompts", str(write_prompts(tmp_path)), "--modes", mode,
                   "--concurrency", "1", "--requests", "3", "--max-new-tokens", "16", "--threads", "2",
                   "--loop-modes", "plain,ngram:3", "--json", timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert set(result["modes"]) == {"vllm-plain", mode}
    assert result["modes"][mode]["1"]["acceptance"]["drafts"] > 0  # the copy prompts give n-grams to draft
    assert result["modes"]["vllm-plain"]["1"]["acceptance"]["drafts"] == 0
    arguments = result["manifest"]["engine"]["servers"][mode]["arguments"]
    assert json.loads(arguments[arguments.index("--speculative-config") + 1])["num_speculative_tokens"] == 3
    assert result["k_table"] == {}  # a config file's K is not one of a fixed mode's
    own = result["own_loop"]
    assert own["concurrency"] == 1 and own["prompts"] == 3 and set(own["modes"]) == {"plain", "ngram:3"}
    assert own["modes"]["ngram:3"]["identical_to_plain"] is True and own["modes"]["plain"]["tokens_per_s"] > 0
    assert 0 < own["modes"]["plain"]["p50_token_latency_s"] <= own["modes"]["plain"]["p90_token_latency_s"]  # beside TPOT
    assert "specdec's own loop at concurrency 1" not in done.stdout  # --json: the object alone
    assert not [s for s in running_servers() if mode in s.get("mode", "")]
