"""specdec against REAL vLLM servers (no mock): the test run's plain server and the one started from
specdec's exported prompt-lookup config (conftest's ``vllm_servers``), then the bench at concurrency
1 and 4, the equivalence check and `watch --once --json` attached to them; when the test run ends,
nothing of them may still run."""

from __future__ import annotations

import json
import shutil

import pytest

from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, write_profile
from specdec_cli.serving.client import complete
from specdec_cli.serving.configs import encode_prompts
from specdec_cli.serving.server import log_directory, running_servers

from engine_support import PROMPTS, VLLM_SERVERS, error_lines, specdec, write_prompts

pytestmark = VLLM_SERVERS

TIMEOUT = 600  # seconds any one command may take on a loaded 2-core machine


@pytest.fixture(scope="module")
def servers(vllm_servers):
    """The test run's servers by mode: the exported config drafts at K 4 up to 3 requests in flight."""
    return {"vllm-plain": vllm_servers.plain, "vllm-ngram:4": vllm_servers.exported}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("vllm"))


def test_bench_against_real_servers_at_concurrency_1_and_4(servers, prompts, tmp_path):
    plain, ngram = servers["vllm-plain"].endpoint.url, servers["vllm-ngram:4"].endpoint.url
    page = tmp_path / "bench.md"
    done = specdec("bench", "--server", ngram, "--reference", plain, "--prompts", str(prompts), "--concurrency", "1,4",
                   "--max-new-tokens", "16", "--json", "--markdown", str(page), timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = [line for line in page.read_text().splitlines() if line.startswith(("| 1 |", "| 4 |"))]
    assert [row.split(" | ")[:2] for row in rows] == [["| 1", "vllm-plain"], ["| 1", "server"], ["| 4", "vllm-plain"],
                                                      ["| 4", "server"]]
    assert result["levels"] == [1, 4]
    for mode in ("vllm-plain", "server"):
        for level in ("1", "4"):
            figures = result["modes"][mode][level]
            assert figures["failed"] == 0 and figures["completed"] == figures["requests"] >= 3
            assert figures["output_tokens"] == 16 * figures["requests"]  # ignore_eos: every request runs to the end
            assert figures["ttft"]["p50_ms"] > 0 and figures["e2el"]["p99_ms"] >= figures["e2el"]["p50_ms"]
    assert result["modes"]["vllm-plain"]["1"]["acceptance"]["drafts"] == 0
    accepted = result["modes"]["server"]["1"]["acceptance"]
    assert accepted["drafts"] > 0 and accepted["accepted"] > 0 and len(accepted["per_position"]) == 4
    assert set(result["gain"]["server"]) == {"1", "4"} and result["gain"]["server"]["1"]["gain"] > 0
    assert result["k_table"] == {}  # an attached server's K is not known: no table is made up


def test_ngram_server_equals_plain_token_for_token(servers, prompts, tmp_path):
    plain, ngram = servers["vllm-plain"].endpoint.url, servers["vllm-ngram:4"].endpoint.url
    report = tmp_path / "equivalence.json"
    done = specdec("verify-equivalence", "--server", ngram, "--reference", plain, "--prompts", str(prompts),
                   "--max-new-tokens", "16", "--concurrency", "3", "--report", str(report), timeout=TIMEOUT)
    result = json.loads(report.read_text())
    assert set(result["levels"]) == {"1", "3"}
    for level in result["levels"].values():
        assert level["identical"] + level["near_ties"] + level["divergences"] + len(level["failed"]) == 3
        assert level["drafts"] > 0
        for detail in level["details"]:  # any divergence is located and classified
            assert detail["kind"] in ("near-tie", "divergence") and 0 <= detail["position"] < 16
    assert done.returncode == (0 if result["equivalent"] else 1), done.stderr
    assert result["equivalent"] == all(lv["divergences"] == 0 and not lv["failed"] for lv in result["levels"].values())
    # the tokens themselves, asked of each server alone: equal, or their first difference is a located near-tie
    ids = encode_prompts(servers["vllm-plain"].config.model_dir, [(p["id"], p["prompt"]) for p in PROMPTS])
    near_ties = {(d["prompt_id"], d["position"]) for lv in result["levels"].values() for d in lv["details"]
                 if d["kind"] == "near-tie"}
    for prompt_id, tokens in ids:
        reference = complete(servers["vllm-plain"].endpoint, tokens, 16)
        speculative = complete(servers["vllm-ngram:4"].endpoint, tokens, 16)
        assert reference.error is None and speculative.error is None and len(reference.token_ids) > 0
        if speculative.token_ids != reference.token_ids:
            first = next((i for i, (a, b) in enumerate(zip(reference.token_ids, speculative.token_ids)) if a != b),
                         min(len(reference.token_ids), len(speculative.token_ids)))
            assert (prompt_id, first) in near_ties, (prompt_id, reference.token_ids, speculative.token_ids)
    assert result["equivalent"], result["levels"]


def test_equivalence_fails_when_nothing_was_drafted(servers, prompts):
    plain = servers["vllm-plain"].endpoint.url
    done = specdec("verify-equivalence", "--server", plain, "--reference", plain, "--prompts", str(prompts),
                   "--max-new-tokens", "8", "--concurrency", "2", timeout=TIMEOUT)
    assert done.returncode == 1
    assert error_lines(done.stderr) == ["specdec: error: the speculative server drafted nothing: its output proves "
                                        "nothing about speculation"]


def test_watch_once_json_reads_the_real_counters(servers):
    ngram = servers["vllm-ngram:4"].endpoint.url
    done = specdec("watch", ngram, "--once", "--json", "--interval", "0.5", timeout=120)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["engine"] == "vllm" and shown["url"] == ngram
    assert shown["acceptance"]["drafts"] > 0 and shown["acceptance"]["mean_acceptance_length"] > 1.0
    assert shown["running"] == 0 and shown["waiting"] == 0
    assert shown["ttft"]["p50_ms"] > 0 and shown["break_even"]["paying"] is None


def test_watch_compares_the_server_with_its_export_and_profile(servers, tmp_path):
    """`watch --export`: the K the server drafts (its counters) equals the exported K, and its α on copy
    prompts is far above a profile calibrated at α 0, so the verdict is drift with the warning."""
    server = servers["vllm-ngram:4"]
    ids = encode_prompts(server.config.model_dir, [(p["id"], p["prompt"]) for p in PROMPTS])
    done = [complete(server.endpoint, tokens, 96, ignore_eos=True) for _, tokens in ids]  # three requests that draft
    assert [c.error for c in done] == [None] * len(PROMPTS)
    spec = tmp_path / "spec.json"  # what `specdec export --engine vllm --out` wrote: the config the server runs
    spec.write_text(json.dumps(server.config.speculative))
    profile = tmp_path / "profile.yaml"
    calibrated = ScenarioProfile(k=4, verdict="speculate", best_k=4, speedup=1.2, alpha=0.0, c=0.0, verify_cost={4: 1.5})
    write_profile(profile, PairProfile(pair="copy", calibrated="2026-12-01T00:00:00+00:00", target="t", draft="ngram",
                                       scenarios={"copy": calibrated}, overall=calibrated,
                                       settings={"prompt_count": 10, "max_new_tokens": 32, "k": "0,4"},
                                       drafter={"kind": "ngram", "lookup": False, "source": "ngram 2-4"}))
    watched = specdec("watch", server.endpoint.url, "--once", "--json", "--interval", "0.5", "--export", str(spec),
                      "--profile", str(profile), timeout=120)
    assert watched.returncode == 0, watched.stderr
    shown = json.loads(watched.stdout)["recommendation"]
    assert shown["recommended_k"] == 4 and shown["recommended_from"] == "table row [1, 3, 4]"
    assert 3.5 <= shown["measured_k"] <= 4.0 and shown["agree"] is True  # draft tokens / drafts from the counters
    drift = shown["drift"]
    assert drift["draft_tokens"] >= drift["min_draft_tokens"] and drift["profile_interval"][0] == 0.0
    assert drift["verdict"] == "above" and drift["warning"] is True and drift["interval"][0] > drift["profile_interval"][1]
    assert drift["text"].startswith(f"traffic drifted: α {drift['alpha']:.2f} is above the profile's 0.00")
    assert "specdec calibrate-k" in drift["text"]


def test_watch_without_url_finds_the_server_specdec_started(servers, tmp_path, monkeypatch):
    # the entries these servers wrote, in a cache of the test's own: a llama.cpp test on the other
    # worker may start a newer server in the run's
    logs = tmp_path / "cache" / log_directory().name
    logs.mkdir(parents=True)
    for entry in log_directory().glob("*.running.json"):
        if json.loads(entry.read_text())["url"] in {server.endpoint.url for server in servers.values()}:
            shutil.copy2(entry, logs / entry.name)  # with its time: the newest comes first
    monkeypatch.setenv("SPECDEC_CACHE", str(logs.parent))
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"gain": {"vllm-ngram:4": {"1": {"gain": 1.5}, "4": {"gain": 0.9}}},
                                 "crossover": {"vllm-ngram:4": 3.0}}))
    done = specdec("watch", "--once", "--json", "--interval", "0.2", "--curve", str(curve), "--mode", "vllm-ngram:4",
                   timeout=120)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    found = [entry["url"] for entry in running_servers()]
    assert sorted(found) == sorted(server.endpoint.url for server in servers.values())
    assert shown["url"] == found[0]  # the newest
    assert shown["break_even"]["paying"] is True and "1.50× plain" in shown["break_even"]["text"]


def test_open_loop_bench_at_a_rate(servers, prompts):
    plain, ngram = servers["vllm-plain"].endpoint.url, servers["vllm-ngram:4"].endpoint.url
    done = specdec("bench", "--server", ngram, "--reference", plain, "--prompts", str(prompts), "--rate", "4",
                   "--requests", "4", "--max-new-tokens", "8", "--slo", "ttft:60000,tpot:60000", "--json", timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["manifest"]["loop"] == "open (Poisson arrivals, requests/s)" and result["levels"] == [4]
    for mode in ("vllm-plain", "server"):
        figures = result["modes"][mode]["4"]
        assert figures["requests"] == 4 and figures["failed"] == 0
        assert figures["goodput"] == figures["request_throughput"]  # limits of a minute: every request meets them
