"""`specdec watch --export`: the recommended K at a load, the K a server drafts, and drift of its α
from the calibrated interval, on exact numbers (pure functions; the real server is test_vllm_engine.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from rich.console import Console

from specdec_cli.commands import watch as command
from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, write_profile
from specdec_cli.serving import drift, metrics, watch_figures
from specdec_cli.serving.drift import Band, Schedule

TABLE = [[1, 2, 4], [3, 7, 2], [16, 256, 0]]
EXPORT = {"engine": "vllm", "pair": "smollm2-135m", "k": 4, "origin": "K 4 from the engine bench b.json",
          "speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                                 "prompt_lookup_max": 4, "num_speculative_tokens_per_batch_size": TABLE}}


def page(drafts: int, tokens: int, accepted: int, positions: list[int], generated: int, running: int = 0) -> str:
    lines = [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}',
             f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {tokens}',
             f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}',
             f'vllm:generation_tokens_total{{engine="0"}} {generated}',
             f'vllm:num_requests_running{{engine="0"}} {running}']
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {n}'
              for i, n in enumerate(positions)]
    return "\n".join(lines) + "\n"


# --- what the export asks for ---------------------------------------------------------------------


def test_schedule_read_from_export_json_and_from_its_out_file():
    assert drift.schedule_from(EXPORT) == Schedule(4, ((1, 2, 4), (3, 7, 2), (16, 256, 0)), "ngram")
    assert drift.schedule_from(EXPORT["speculative_config"]) == drift.schedule_from(EXPORT)
    assert drift.schedule_from({"method": "draft_model", "model": "d", "num_speculative_tokens": 3}) == Schedule(3, (), "draft_model")
    assert drift.schedule_from({}) == Schedule(0)  # --out when no K pays
    assert drift.schedule_from({**EXPORT, "speculative_config": None}) == Schedule(0)
    assert drift.schedule_from({"method": "ngram", "num_speculative_tokens": 2,
                                "num_speculative_tokens_per_batch_size": [[9, 20, 1], [1, 8, 2]]}).table == ((1, 8, 2), (9, 20, 1))


@pytest.mark.parametrize("data, message", [
    ({"engine": "sglang", "adaptive_config": None}, "exported for 'sglang'"),
    ([1, 2], "expected a JSON object"),
    ({"num_speculative_tokens": 4}, "needs a method"),
    ({"method": "ngram", "num_speculative_tokens": -1}, "needs a method"),
    ({"method": "ngram", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": []}, "non-empty list"),
    ({"method": "ngram", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[2, 8, 3]]}, "must start at 1"),
    ({"method": "ngram", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 8, 3], [8, 9, 1]]},
     "not overlap"),
    ({"method": "ngram", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 8]]}, "is not"),
    ({"method": "ngram", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 8, -1]]}, "K >= 0"),
])
def test_what_is_not_a_vllm_export_is_refused(data, message):
    with pytest.raises(ValueError, match=message):
        drift.schedule_from(data)


def test_recommended_k_follows_vllms_expansion_of_the_table():
    schedule = drift.schedule_from(EXPORT)
    assert drift.recommended_k(schedule, 0) == (4, "table row [1, 2, 4]")  # idle: judged at one request
    assert drift.recommended_k(schedule, 2) == (4, "table row [1, 2, 4]")
    assert drift.recommended_k(schedule, 3) == (2, "table row [3, 7, 2]")
    assert drift.recommended_k(schedule, 7) == (2, "table row [3, 7, 2]")
    assert drift.recommended_k(schedule, 8) == (2, "table gap after row [3, 7, 2]")  # a gap keeps the K before it
    assert drift.recommended_k(schedule, 15) == (2, "table gap after row [3, 7, 2]")
    assert drift.recommended_k(schedule, 16) == (0, "table row [16, 256, 0]")  # a K 0 row: plain decoding
    assert drift.recommended_k(schedule, 300) == (0, "table past row [16, 256, 0]")
    assert drift.recommended_k(Schedule(3, ((1, 4, 5), (5, 9, 1))), 2) == (3, "table row [1, 4, 5]")  # capped at K
    assert drift.recommended_k(Schedule(3, ((1, 4, 5), (5, 9, 1))), 12) == (1, "table past row [5, 9, 1]")
    assert drift.recommended_k(Schedule(5), 40) == (5, "num_speculative_tokens")
    assert drift.recommended_k(Schedule(0), 1) == (0, "num_speculative_tokens")


def test_measured_k_and_agreement():
    assert drift.measured_k(10, 40, 500) == 4.0
    assert drift.measured_k(8, 27, 100) == 3.375
    assert drift.measured_k(0, 0, 500) == 0.0  # generating without drafting: K 0 in effect
    assert drift.measured_k(0, 0, 0) is None  # idle: no evidence either way
    assert drift.k_agrees(4, 3.5) is True and drift.k_agrees(4, 3.49) is False  # K_SLACK 0.5, inclusive
    assert drift.k_agrees(2, 2.5) is True and drift.k_agrees(2, 2.51) is False
    assert drift.k_agrees(0, 0.0) is True and drift.k_agrees(0, 4.0) is False
    assert drift.k_agrees(3, None) is None


# --- the calibrated interval ----------------------------------------------------------------------


def test_wilson_interval_on_known_values():
    low, high = drift.wilson(50, 100)
    assert (round(low, 4), round(high, 4)) == (0.4038, 0.5962)
    low, high = drift.wilson(0, 20)
    assert low == 0.0 and round(high, 4) == 0.1611
    low, high = drift.wilson(20, 20)
    assert round(low, 4) == 0.8389 and high == 1.0
    assert drift.wilson(0, 0) == (0.0, 1.0)


def test_judged_drafts_per_generated_token():
    assert drift.judged_per_token(0.0, 4) == 1.0  # every round judges one draft and yields one token
    assert drift.judged_per_token(1.0, 4) == 0.8  # K judged for K + 1 tokens
    assert drift.judged_per_token(0.5, 2) == pytest.approx(0.75 / 0.875)
    assert drift._measured("0..3") == [0, 1, 2, 3] and drift._measured("0,2,3") == [0, 2, 3]
    assert drift._measured("two") == [] and drift._measured(None) == []


def test_profile_band_from_the_counts_the_profile_keeps():
    band = drift.profile_band(0.5, 9, 24, "0,2,3")
    judged = int(216 * 0.75 / 0.875 + 216 * 0.875 / 0.9375)  # 9 prompts x 24 tokens at K 2 and at K 3
    assert band.judged == judged == 386
    assert (band.low, band.high) == drift.wilson(0.5 * 386, 386)
    assert round(band.low, 4) == 0.4504 and round(band.high, 4) == 0.5496
    assert drift.profile_band(0.6, None, 24, "0..8") == Band(0.6, 0.6, 0.6, None)  # no counts: the point itself
    assert drift.profile_band(0.6, 9, 24, "0") == Band(0.6, 0.6, 0.6, None)  # nothing drafted in calibration


def test_drift_verdicts_at_the_boundaries_of_the_interval():
    low, high = drift.wilson(30, 100)  # the server: 30 of 100 judged drafts accepted
    assert drift.drift(Band(0.5, high, 0.6, 500), 30, 100, 100)["verdict"] == "inside"  # touching is inside
    below = drift.drift(Band(0.5, high + 1e-9, 0.6, 500), 30, 100, 100)
    assert below["verdict"] == "below" and below["warning"] is True
    assert below["interval"] == [round(low, 4), round(high, 4)] and below["alpha"] == 0.3
    assert below["text"].startswith("traffic drifted: α 0.30 is below the profile's 0.50 (")
    assert "specdec calibrate-k" in below["text"] and "specdec export --engine vllm" in below["text"]
    assert drift.drift(Band(0.2, 0.1, low, 500), 30, 100, 100)["verdict"] == "inside"
    above = drift.drift(Band(0.2, 0.1, low - 1e-9, 500), 30, 100, 100)
    assert above["verdict"] == "above" and above["warning"] is True
    point = drift.drift(Band(0.3, 0.3, 0.3, None), 30, 100, 100)
    assert point["verdict"] == "inside" and point["profile_interval"] == [0.3, 0.3]


def test_drift_needs_enough_drafted_tokens_and_a_profile():
    band = Band(0.9, 0.85, 0.95, 900)
    few = drift.drift(band, 10, 90, drift.MIN_DRAFT_TOKENS - 1)
    assert few["verdict"] == "too few drafts to tell" and few["warning"] is False
    assert few["text"] == "99 tokens drafted (under 100): too few drafts to tell drift"
    assert drift.drift(band, 10, 90, drift.MIN_DRAFT_TOKENS)["verdict"] == "below"
    assert drift.drift(band, 0, 0, 0)["verdict"] == "too few drafts to tell"
    none = drift.drift(None, 30, 100, 400, "no calibration profile at /x.yaml")
    assert none == {"min_draft_tokens": 100, "draft_tokens": 400, "warning": False, "alpha": 0.3,
                    "verdict": "no profile", "text": "no calibration profile at /x.yaml: drift from it cannot be judged"}


# --- one reading ----------------------------------------------------------------------------------


def test_recommendation_from_a_metrics_page():
    snapshot = metrics.parse(page(100, 400, 200, [80, 60, 40, 20], 900, running=5))
    band = Band(0.9, 0.85, 0.95, 900)
    shown = drift.recommendation(drift.schedule_from(EXPORT), band, snapshot, "interval", 5, "profile p.yaml")
    assert {k: shown[k] for k in ("running", "recommended_k", "recommended_from", "measured_k", "agree")} == {
        "running": 5, "recommended_k": 2, "recommended_from": "table row [3, 7, 2]", "measured_k": 4.0, "agree": False}
    assert shown["text"] == "K: export 2 at 5 running, server 4.00 per draft (interval): differ"
    judged = 100 + 80 + 60 + 40  # drafts reaching positions 0..3
    assert shown["drift"]["alpha"] == round(200 / judged, 4) and shown["drift"]["verdict"] == "below"
    assert shown["profile"] == "profile p.yaml"


def test_recommendation_when_nothing_was_drafted():
    schedule = drift.schedule_from(EXPORT)
    busy = drift.recommendation(schedule, None, metrics.parse(page(0, 0, 0, [0, 0, 0, 0], 300)), "since start", 1)
    assert busy["measured_k"] == 0.0 and busy["agree"] is False
    assert busy["text"] == "K: export 4 at 1 running, server none drafted (since start): differ"
    assert busy["drift"]["verdict"] == "no profile"
    idle = drift.recommendation(schedule, None, metrics.parse(page(0, 0, 0, [], 0)), "since start", 0)
    assert idle["measured_k"] is None and idle["agree"] is None and idle["text"].endswith("cannot tell")
    plain = drift.recommendation(Schedule(0), None, metrics.parse(page(0, 0, 0, [], 300)), "since start", 20)
    assert plain["agree"] is True and plain["recommended_k"] == 0


def test_live_view_shows_the_warning_on_a_narrow_terminal_without_colour():
    snapshot = metrics.parse(page(100, 400, 200, [80, 60, 40, 20], 900, running=1))
    shown = watch_figures.figures(snapshot, snapshot.minus(metrics.parse(""))) | {"url": "http://h:1"}
    shown["break_even"] = watch_figures.judgement(None, None, 1)
    shown["recommendation"] = drift.recommendation(drift.schedule_from(EXPORT), Band(0.9, 0.85, 0.95, 900),
                                                   snapshot, shown["acceptance_scope"], 1)
    console = Console(width=40, record=True, color_system=None, file=open("/dev/null", "w"))
    console.print(command.render(shown))
    text = console.export_text()
    assert "\x1b[" not in text and max(len(line) for line in text.splitlines()) <= 40
    flat = " ".join(text.split())
    assert "K: export 4 at 1 running, server 4.00 per draft (interval): agree" in flat
    assert "warning: traffic drifted: α 0.71 is below the profile's 0.90 (0.85-0.95)" in flat


# --- the command's inputs -------------------------------------------------------------------------


def write_pair_profile(path, alpha=0.62, lookup=False):
    section = ScenarioProfile(k=3, verdict="speculate", best_k=3, speedup=1.4, alpha=alpha, c=0.1, verify_cost={3: 1.2})
    write_profile(path, PairProfile(pair="smollm2-135m@int4", calibrated="2026-12-01T10:00:00+00:00", target="t", draft="d",
                                    scenarios={"chat": section}, overall=section, dtype="int4",
                                    settings={"prompt_count": 10, "max_new_tokens": 32, "k": "0,3"},
                                    drafter={"kind": "head", "lookup": lookup, "source": "h", "sha256": "x"}))


def test_profile_named_by_the_export_or_given(tmp_path):
    profile = tmp_path / "profile.yaml"
    write_pair_profile(profile, lookup=True)
    named = {**EXPORT, "origin": f"K 3 from specdec's own loop (profile {profile} (pair 'smollm2-135m@int4', calibrated x), ...)"}
    found = command._calibrated(None, named)
    assert found.band == drift.profile_band(0.62, 10, 32, "0,3") and found.band.judged == int(320 * drift.judged_per_token(0.62, 3))
    assert found.about == f"profile {profile} (pair 'smollm2-135m@int4', calibrated 2026-12-01T10:00:00+00:00)"
    assert found.notes == ("the profile ran prompt lookup before its drafter; the engine runs the drafter alone, so a lower α is expected",
                           "the profile measured a head drafter; the export drafts with ngram")
    assert command._calibrated(str(profile), EXPORT["speculative_config"]).band == found.band  # --out file, --profile
    missing = command._calibrated(None, {**EXPORT, "origin": f"profile {tmp_path}/none.yaml (pair 'p', calibrated x)"})
    assert missing.band is None and missing.about == f"no calibration profile at {tmp_path}/none.yaml"
    recorded = {**EXPORT, "profile": {"path": str(profile), "section": "smollm2-135m@int4"}}  # export --json's own field
    assert command._calibrated(None, recorded).band == found.band


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def dead_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("content, extra, message", [
    ("{not json", [], "--export {f}: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    (json.dumps({"engine": "llama.cpp", "flags": []}), [],
     "--export {f}: exported for 'llama.cpp'; watch compares a vLLM export (--engine vllm); give the output of "
     "`specdec export --engine vllm --json` or the file its --out wrote"),
    (json.dumps({"model": "x"}), [], "--export {f}: not vLLM's --speculative-config: it needs a method and a "
     "num_speculative_tokens of 0 or more; give the output of `specdec export --engine vllm --json` or the file its --out wrote"),
    (json.dumps(EXPORT), ["--profile", "/nonexistent/profile.yaml"], "--profile file not found: /nonexistent/profile.yaml"),
])
def test_export_mistakes_are_one_line_and_exit_2_before_any_server_is_asked(tmp_path, content, extra, message):
    export = tmp_path / "export.json"
    export.write_text(content)
    done = run("watch", dead_url(), "--once", "--export", str(export), *extra)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"specdec: error: {message.format(f=export)}"]


def test_profile_without_export_and_missing_export_are_refused(tmp_path):
    done = run("watch", dead_url(), "--once", "--profile", str(tmp_path / "p.yaml"))
    assert done.returncode == 2
    assert done.stderr.strip() == "specdec: error: --profile judges drift from an export's recommendation: give --export FILE too"
    done = run("watch", dead_url(), "--once", "--export", str(tmp_path / "none.json"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"specdec: error: --export {tmp_path / 'none.json'}: No such file or directory"
