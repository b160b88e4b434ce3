"""specdec against a REAL llama.cpp server (no mock), the one `bash install.sh test` builds: the bench
at concurrency 1 and 2 with plain and prompt lookup, the head drafting as EAGLE-3, the equivalence
check with drafts, the export's flags starting a server that drafts as asked, `watch --once --json`
on its counters, a server killed mid-run and a busy port; after every test, no llama-server may
still run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specdec_cli.pairs.loading import gguf_file, transformers_directory
from specdec_cli.pairs.registry import load_registry
from specdec_cli.serving import metrics
from specdec_cli.serving.client import complete
from specdec_cli.serving.configs import encode_prompts
from specdec_cli.serving.llama_server import LlamaConfig, speculative_flags
from specdec_cli.serving.server import ManagedServer, free_port

from engine_support import (LLAMA_SERVERS, PROMPTS, SERVER_THREADS, assert_killed_run, assert_port_refused, busy_port,
                            error_lines, group_alive, kill_mid_bench, llama_servers, port_logs, require_llama,
                            specdec, write_prompts)

pytestmark = LLAMA_SERVERS

TIMEOUT = 300  # seconds any one command may take on a loaded 2-core machine
TOKENS = "96"  # long enough for ngram-mod (24-token matches) to find the copies


@pytest.fixture(autouse=True)
def nothing_left_running():
    require_llama()
    before = set(llama_servers())
    yield
    assert set(llama_servers()) <= before, "a llama-server outlived its test"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("llama"))


def bench_args(prompts: Path, *extra: str, loop: str = "none", tokens: str = TOKENS) -> list[str]:
    return ["bench", "--engine", "llama.cpp", "--prompts", str(prompts), "--max-new-tokens", tokens,
            "--threads", str(SERVER_THREADS),
            "--loop-modes", loop, *extra]


@pytest.fixture(scope="module")
def bench(prompts, tmp_path_factory):
    """One engine bench for the module: llama-plain and llama-ngram:4 at concurrency 1 and 2, and
    specdec's own loop (plain, ngram:3) on the concurrency-1 prompts after the servers stopped."""
    require_llama()
    out = tmp_path_factory.mktemp("llama-bench") / "bench.json"
    done = specdec(*bench_args(prompts, "--modes", "llama-plain,llama-ngram:4", "--concurrency", "1,2", "--json",
                               loop="plain,ngram:3"), timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    out.write_text(done.stdout)
    return json.loads(done.stdout), out


def test_bench_measures_plain_and_lookup_at_concurrency_1_and_2(bench):
    result, _ = bench
    assert result["levels"] == [1, 2] and result["plain"] == "llama-plain"
    for mode in ("llama-plain", "llama-ngram:4"):
        for level in ("1", "2"):
            figures = result["modes"][mode][level]
            assert figures["failed"] == 0 and figures["completed"] == figures["requests"] >= 3
            assert figures["output_tokens"] == int(TOKENS) * figures["requests"]  # ignore_eos: every request runs to the end
            assert figures["ttft"]["p50_ms"] > 0 and figures["e2el"]["p99_ms"] >= figures["e2el"]["p50_ms"]
    assert result["modes"]["llama-plain"]["1"]["acceptance"]["drafts"] == 0
    lookup = result["modes"]["llama-ngram:4"]["1"]["acceptance"]
    assert lookup["drafts"] > 0 and 0 < lookup["accepted"] <= lookup["draft_tokens"]
    assert set(result["gain"]["llama-ngram:4"]) == {"1", "2"} and result["gain"]["llama-ngram:4"]["1"]["gain"] > 0
    engine = result["manifest"]["engine"]
    assert engine["name"].startswith("llama.cpp ") and Path(engine["binary"]).is_file()
    arguments = engine["servers"]["llama-ngram:4"]["arguments"]
    assert arguments[arguments.index("--spec-type") + 1] == "ngram-mod" and arguments[arguments.index("-np") + 1] == "2"
    assert arguments[arguments.index("--spec-ngram-mod-n-max") + 1] == "4"  # K: ngram types ignore --spec-draft-n-max
    assert "--spec-type" not in engine["servers"]["llama-plain"]["arguments"]
    gguf = gguf_file(load_registry(None).pair(None).target.source, "test")
    assert arguments[arguments.index("-m") + 1] == str(gguf)  # the pair's GGUF as it is: the loop's own weights
    assert result["manifest"]["target"]["gguf"] == str(gguf)


def test_the_own_loop_runs_beside_a_managed_bench(bench):
    result, out = bench
    own = result["own_loop"]
    assert own["concurrency"] == 1 and own["prompts"] == 3 and set(own["modes"]) == {"plain", "ngram:3"}
    assert own["modes"]["ngram:3"]["identical_to_plain"] is True and own["modes"]["plain"]["tokens_per_s"] > 0
    assert 0 < own["modes"]["plain"]["p50_token_latency_s"] <= own["modes"]["plain"]["p90_token_latency_s"]  # beside TPOT
    assert out.read_text().lstrip().startswith("{")  # --json: the object alone, no table before it


def test_equivalence_with_the_draft_model_drafts_and_places_every_divergence(prompts, tmp_path):
    report = tmp_path / "equivalence.json"
    done = specdec("verify-equivalence", "--engine", "llama.cpp", "--spec", "draft:3", "--prompts", str(prompts),
                   "--max-new-tokens", "32", "--concurrency", "2", "--threads", str(SERVER_THREADS), "--json",
                   "--report", str(report),
                   timeout=TIMEOUT)
    result = json.loads(done.stdout)
    assert done.returncode == (0 if result["equivalent"] else 1), done.stderr  # a divergence is a finding, exit 1
    assert json.loads(report.read_text()) == result
    assert set(result["levels"]) == {"1", "2"} and result["reference"] == "llama-plain"
    for level in result["levels"].values():
        assert level["drafts"] > 0 and 0 < level["accepted"] <= level["draft_tokens"] and level["failed"] == []
        assert level["identical"] + level["near_ties"] + level["divergences"] == level["prompts"] == len(PROMPTS)
        assert level["plain_repeat"]["identical"] + level["plain_repeat"]["near_ties"] + level["plain_repeat"]["divergences"] == len(PROMPTS)
        for divergence in level["details"]:
            assert divergence["kind"] in ("near-tie", "divergence") and divergence["position"] >= 0
            assert isinstance(divergence["plain_repeat_differs"], bool)
    drafted = result["manifest"]["engine"]["servers"]["llama-draft:3"]["arguments"]
    assert Path(drafted[drafted.index("--spec-draft-model") + 1]).is_file()  # converted to GGUF once, in the cache


def test_the_heads_eagle3_export_drafts_inside_llama_cpp(prompts):
    """llama-eagle3:K: the head exported for llama.cpp's layer (no attention biases: a biased export is
    refused at load) and converted by the same sources' converter loads and drafts, K at most a round."""
    # 48 tokens: the head drafts from the first (no 24-token match to wait for, as ngram-mod's)
    done = specdec(*bench_args(prompts, "--modes", "llama-eagle3:3", "--concurrency", "1", "--json", tokens="48"),
                   timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    acceptance = result["modes"]["llama-eagle3:3"]["1"]["acceptance"]
    assert acceptance["drafts"] > 0 and acceptance["draft_tokens"] <= 3 * acceptance["drafts"]
    assert 0 < acceptance["accepted"] <= acceptance["draft_tokens"]
    arguments = result["manifest"]["engine"]["servers"]["llama-eagle3:3"]["arguments"]
    assert arguments[arguments.index("--spec-type") + 1] == "draft-eagle3"
    head = Path(arguments[arguments.index("--spec-draft-model") + 1])
    assert head.suffix == ".gguf" and head.parent.name == "llama-drafts" and head.is_file()  # converted once, in the cache
    from gguf import GGUFReader

    layers = GGUFReader(head).fields["eagle3.target_layers"].contents()
    assert layers == [2, 15, 29]  # the head's layers, the last state as layer 29's input (not the converter's guess, 27)


def test_exported_flags_start_a_server_that_drafts_as_asked_and_watch_reads_it(bench, tmp_path):
    result, path = bench
    from_bench = specdec("export", "--engine", "llama.cpp", "--drafter", "ngram", "--from-bench", str(path), "--json",
                         timeout=120)
    assert from_bench.returncode == 0, from_bench.stderr
    level = result["modes"]
    best = "llama-ngram:4" if level["llama-ngram:4"]["1"]["output_tok_s"] > level["llama-plain"]["1"]["output_tok_s"] else None
    flags = json.loads(from_bench.stdout)["flags"]
    assert ("--spec-type" in flags) == (best is not None)  # K from the engine's own measured speed at level 1

    measured = tmp_path / "bench.json"  # a bench in which lookup at K 4 won: its export must draft
    measured.write_text(json.dumps({"modes": {"llama-plain": {"1": {"output_tok_s": 100.0}},
                                              "llama-ngram:4": {"1": {"output_tok_s": 130.0}}}}))
    done = specdec("export", "--engine", "llama.cpp", "--drafter", "ngram", "--from-bench", str(measured), "--json",
                   timeout=120)
    assert done.returncode == 0, done.stderr
    flags = json.loads(done.stdout)["flags"]
    gguf = gguf_file(load_registry(None).pair(None).target.source, "test")
    assert flags[:3] == ["llama-server", "-m", str(gguf)]
    assert flags[3:] == ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "4", "--spec-ngram-mod-n-min", "1"]
    with ManagedServer(LlamaConfig("export", gguf, "smol", tuple(flags[3:]), threads=SERVER_THREADS)) as server:
        ids = encode_prompts(transformers_directory(load_registry(None).pair(None).target.source),
                             [(p["id"], p["prompt"]) for p in PROMPTS])
        done = [complete(server.endpoint, tokens, 96, ignore_eos=True) for _, tokens in ids]
        assert [c.error for c in done] == [None] * len(PROMPTS) and all(c.output_tokens == 96 for c in done)
        counters = metrics.scrape(server.endpoint)
        assert counters.engine == "llama.cpp" and counters.value(metrics.DRAFTS) > 0
        assert counters.value(metrics.DRAFT_TOKENS) <= 4 * counters.value(metrics.DRAFTS)  # K 4, as exported
        assert counters.value(metrics.DRAFT_TOKENS) == sum(c.drafted for c in done)  # the counters and the responses agree
        assert counters.value(metrics.ACCEPTED) == sum(c.accepted for c in done)
        watched = specdec("watch", server.endpoint.url, "--once", "--json", "--interval", "0.3", timeout=120)
        assert watched.returncode == 0, watched.stderr
        shown = json.loads(watched.stdout)
        assert shown["engine"] == "llama.cpp" and shown["acceptance_scope"] == "since start"  # nothing drafted in the window
        assert shown["acceptance"]["drafts"] == counters.value(metrics.DRAFTS)
        assert shown["acceptance"]["accepted"] == counters.value(metrics.ACCEPTED)
        assert shown["running"] == 0 and shown["ttft"]["p50_ms"] is None  # llama.cpp keeps no latency histograms
    assert not group_alive(server.process.pid)


def test_a_bench_attached_to_llama_servers_speaks_their_dialect(prompts):
    gguf = gguf_file(load_registry(None).pair(None).target.source, "test")
    with ManagedServer(LlamaConfig("plain", gguf, "smol", threads=SERVER_THREADS)) as plain, \
            ManagedServer(LlamaConfig("lookup", gguf, "smol", speculative_flags("ngram-mod", 4),
                                      threads=SERVER_THREADS)) as lookup:
        done = specdec("bench", "--server", lookup.endpoint.url, "--reference", plain.endpoint.url, "--prompts", str(prompts),
                       "--max-new-tokens", TOKENS, "--concurrency", "1", "--json", timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["plain"] == "llama-plain" and set(result["modes"]) == {"llama-plain", "server"}
    assert result["modes"]["server"]["1"]["failed"] == 0 and result["modes"]["server"]["1"]["acceptance"]["drafts"] > 0


def test_a_server_killed_mid_bench_keeps_the_levels_done_and_exits_3(prompts):
    port = free_port()
    command = [sys.executable, "-m", "specdec_cli", *bench_args(prompts, "--modes", "llama-plain,llama-ngram:4",
                                                                "--concurrency", "1,2", "--requests", "2", "--port",
                                                                str(port), "--json", tokens="64")]
    # the lookup server dies while plain runs level 2, and lookup's level 2 meets it dead (plain's level
    # 2, 64 tokens a request, gives the kill time to land)
    code, lines, out, groups = kill_mid_bench(command, port, ("llama-plain", "llama-ngram:4"), "llama-plain: concurrency 2",
                                              TIMEOUT)
    assert_killed_run(code, lines, out, groups, "llama-ngram:4", "the llama.cpp server for llama-ngram:4 died")


def test_a_busy_port_is_one_error_line_and_exit_2_before_a_server_starts(prompts):
    with busy_port() as port:
        before = port_logs(port)
        done = specdec(*bench_args(prompts, "--modes", "llama-plain", "--concurrency", "1", "--port", str(port)),
                       timeout=TIMEOUT)
    assert_port_refused(done, "llama-plain", port, before)


def test_a_missing_server_is_one_line_that_says_how_to_build_it(prompts, monkeypatch):
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", "/nonexistent/llama-server")
    done = specdec(*bench_args(prompts, "--modes", "llama-plain"), timeout=120)
    assert done.returncode == 2
    assert error_lines(done.stderr) == ["specdec: error: llama.cpp's server is not built ($SPECDEC_LLAMA_SERVER="
                                        "/nonexistent/llama-server is not an executable): run `bash install.sh llama.cpp` "
                                        "(or point $SPECDEC_LLAMA_SERVER at a llama-server binary)"]


def test_the_built_servers_help_names_the_flags_an_export_writes():
    from specdec_cli.export.llama_flags import probe
    from specdec_cli.serving.environment import llama_server

    names = probe()
    assert names.current and (names.spec_type, names.n_max, names.model_draft) == (
        "--spec-type", "--spec-draft-n-max", "--spec-draft-model")
    assert names.source == f"llama-server flag names from {llama_server()} --help (current names)"
