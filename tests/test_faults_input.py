"""Inputs read defensively: a server that is not an engine, a damaged draft head, models.yaml's nested
mappings and a calibration profile of the wrong shape are each one line on stderr and exit code 2,
never a traceback."""

from __future__ import annotations

import http.server
import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.prompts import read_file

runner = CliRunner()


def one_line(result) -> str:
    """The error line, its wrapping undone (rich wraps at the test terminal's width)."""
    return " ".join(result.stderr.split())


# --- a server that is not an engine -----------------------------------------------------------------

PROMETHEUS = "vllm:num_requests_running 0\n"
MODELS = json.dumps({"data": [{"id": "m"}]})
HTML = "<!DOCTYPE html>\n<html><head><title>It works</title></head><body>nginx</body></html>\n"


class _Pages(http.server.BaseHTTPRequestHandler):
    """Answers with the server's ``pages`` (path → body, 'POST path' for a POST); 404 for the rest."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer(self.server.pages.get(f"POST {self.path}"))

    def do_GET(self):
        self.answer(self.server.pages.get(self.path))

    def answer(self, body: str | None) -> None:
        if body is None:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if body.lstrip().startswith("<") else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet in the test's output
        pass


@contextmanager
def foreign_server(pages: dict[str, str]):
    """A web server that is no engine, in this process, on a free loopback port; stopped on leaving."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    server.pages = pages
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("pages, problem", [
    ({"/v1/models": HTML}, "/v1/models answered HTML, not an engine's JSON"),
    ({"/v1/models": "[1, 2]"}, "/v1/models answered a JSON list, not an engine's model list (an object with 'data')"),
    ({"/v1/models": '{"data": [{"name": "m"}]}'}, "/v1/models answered a model list without model ids"),
    ({"/v1/models": '{"data": "m"}'}, "/v1/models answered a model list without model ids"),
    ({"/v1/models": MODELS, "/metrics": HTML}, "/metrics answered HTML, not an engine's Prometheus metrics"),
    ({"/v1/models": MODELS, "/metrics": "hello world\n"},
     "/metrics answered text that is not Prometheus metrics (could not convert string to float: 'world')"),
    ({"/v1/models": MODELS, "/metrics": '{"running": 0}'},
     "/metrics answered JSON, not an engine's Prometheus metrics"),
    ({"/v1/models": MODELS, "/metrics": 'vllm:time_to_first_token_seconds_bucket{le="soon"} 1\n'},
     "/metrics answered text that is not Prometheus metrics (bucket bound le='soon' is not a number)"),
    ({"/v1/models": MODELS, "/metrics": 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x"} 1\n'},
     "/metrics answered text that is not Prometheus metrics (position='x' is not a whole number)"),
    ({"/v1/models": MODELS, "/metrics": "vllm:num_requests_running +Inf\n"},
     "/metrics answered text that is not Prometheus metrics (vllm:num_requests_running is inf)"),
])
def test_watch_on_a_server_that_is_not_an_engine_is_one_line(pages, problem):
    with foreign_server(pages) as url:
        result = runner.invoke(app, ["watch", url, "--once", "--interval", "0.01"])
    assert result.exit_code == 2, result.output
    assert one_line(result) == f"specdec: error: {url}{problem}"


def test_watch_on_an_engine_page_reads_it():
    """The check refuses only what is not an engine's: a real page of metrics still reads."""
    with foreign_server({"/v1/models": MODELS, "/metrics": PROMETHEUS}) as url:
        result = runner.invoke(app, ["watch", url, "--once", "--json", "--interval", "0.01"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["url"] == url


@pytest.mark.parametrize("url, problem", [
    ("http://[::1", "not a URL (Invalid IPv6 URL)"),
    ("http://127.0.0.1:http", "not a URL (Port could not be cast to integer value as 'http')"),
    ("http://127.0.0.1:99999", "not a URL (Port out of range 0-65535)"),
    ("http://", "not a URL (no host)"),
])
def test_a_url_that_is_not_one_is_one_line(url, problem):
    result = runner.invoke(app, ["watch", url, "--once"])
    assert result.exit_code == 2, result.output
    assert one_line(result) == f"specdec: error: {url}: {problem}; give one such as http://127.0.0.1:8000"


def test_engine_bench_against_a_server_that_is_not_an_engine_is_one_line(pair_dir, tmp_path):
    """The check is the client's: `bench --server` (and `verify-equivalence --server`) get it too."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    with foreign_server({"/v1/models": HTML}) as url:
        result = runner.invoke(app, ["bench", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-ngram",
                                     "--prompts", str(prompts), "--server", url])
    assert result.exit_code == 2, result.output
    assert one_line(result) == f"specdec: error: {url}/v1/models answered HTML, not an engine's JSON"


def test_a_streamed_chunk_that_is_not_an_engines_is_a_failure_kind_not_a_traceback():
    """complete() classifies the server's faults (bench counts them per kind); a chunk of the wrong
    shape was an AttributeError out of the request's thread."""
    from specdec_cli.serving.client import Endpoint, complete

    with foreign_server({"POST /v1/completions": "data: [1, 2]\n\n"}) as url:
        result = complete(Endpoint(url, model="m"), [5, 6], 4)
    assert result.error == "malformed"
    assert result.detail == f"{url}/v1/completions streamed a chunk that is not an engine's ('list' object has no attribute 'get')"


# --- a damaged draft head ---------------------------------------------------------------------------

RETRAIN = "train it again or point at another head"


@pytest.fixture
def head(pair_dir, tmp_path):
    """A copy of the tiny pair's head, to damage."""
    import shutil

    return shutil.copytree(pair_dir / "head", tmp_path / "head")


def generate_with(pair_dir, head):
    return runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-ngram",
                               "--draft", str(head), "--max-new-tokens", "4", "hello"])


def export_head(pair_dir, head, tmp_path):
    return runner.invoke(app, ["export-head", str(head), "--out", str(tmp_path / "out"), "--target", str(pair_dir / "target")])


def test_the_head_runs_before_it_is_damaged(pair_dir, head):
    result = generate_with(pair_dir, head)
    assert result.exit_code == 0, result.output


def damage_weights(head, how: str) -> None:
    weights = head / "head.safetensors"
    if how == "cut":
        weights.write_bytes(weights.read_bytes()[:-100])
    else:  # a whole file, but not this head's tensors
        import torch
        from safetensors.torch import save_file

        save_file({"fc.weight": torch.zeros(2, 2)}, weights)


@pytest.mark.parametrize("how, problem", [
    ("cut", "cut short or damaged (Error while deserializing header: incomplete metadata, file not fully covered)"),
    ("other", "does not hold the head its specdec-draft.json describes (Missing key(s) in state_dict: \"fc.bias\""),
])
@pytest.mark.parametrize("command", [generate_with, export_head])
def test_damaged_head_weights_are_one_line(pair_dir, head, tmp_path, command, how, problem):
    damage_weights(head, how)
    result = command(pair_dir, head, tmp_path) if command is export_head else command(pair_dir, head)
    assert result.exit_code == 2, result.output
    line = one_line(result)
    assert line.startswith(f"specdec: error: {head / 'head.safetensors'}: {problem}") and line.endswith(f"; {RETRAIN}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, problem", [
    ('{"kind": "head", ', "not valid JSON (Expecting property name enclosed in double quotes)"),
    ('["head"]', "a JSON list, not an object"),
    (b'{"kind": "h\xe9ad"}', "not UTF-8 text"),
])
@pytest.mark.parametrize("command", [generate_with, export_head])
def test_head_metadata_that_is_no_json_object_is_one_line(pair_dir, head, tmp_path, command, text, problem):
    meta = head / "specdec-draft.json"
    meta.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = command(pair_dir, head, tmp_path) if command is export_head else command(pair_dir, head)
    assert result.exit_code == 2, result.output
    assert one_line(result) == f"specdec: error: {meta}: {problem}; {RETRAIN}"


@pytest.mark.parametrize("change, problem", [
    ({"layer": "big"}, "'layer' must be a mapping (the head's layer shape), got 'big'"),
    ({"target": ["t"]}, "'target' must be a mapping with 'source' and 'fingerprint', got ['t']"),
    ({"feature_layers": [-1, "top"]}, "'feature_layers' must be a list of whole numbers, got [-1, 'top']"),
    ({"top_vocab": {"a": 1}}, "'top_vocab' must be a list of token ids or null, got {'a': 1}"),
    ({"format": "2"}, "'format' must be a whole number, got '2'"),
])
@pytest.mark.parametrize("command", [generate_with, export_head])
def test_head_metadata_of_the_wrong_shape_is_one_line(pair_dir, head, tmp_path, command, change, problem):
    meta = head / "specdec-draft.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), **change}))
    result = command(pair_dir, head, tmp_path) if command is export_head else command(pair_dir, head)
    assert result.exit_code == 2, result.output
    assert one_line(result) == f"specdec: error: {meta}: {problem}; {RETRAIN}"


# --- models.yaml's nested mappings ------------------------------------------------------------------

TARGET = "    target: ./t\n"


@pytest.mark.parametrize("pair, message", [
    ("    target: {source: ./t, dtyp: int4}\n    draft: ngram\n",
     "pair 'p' target: unknown key 'dtyp'; the keys are source, dtype, device_map"),
    ("    target: {source: [./t]}\n    draft: ngram\n", "pair 'p' target: 'source' must be a string, got ['./t']"),
    ("    target: {source: ./t, device_map: [cpu]}\n    draft: ngram\n",
     "pair 'p' target: 'device_map' must be a device or a mapping of modules to devices, got ['cpu']"),
    ("    target: {source: ./t, device_map: {model: [0]}}\n    draft: ngram\n",
     "pair 'p' target: 'device_map' must be a device or a mapping of modules to devices, got {'model': [0]}"),
    (TARGET + "    draft: {kind: ngram, max_ngram: three}\n",
     "pair 'p' draft: 'max_ngram' must be a whole number from 1, got 'three'"),
    (TARGET + "    draft: {kind: ngram, min_ngram: 4, max_ngram: 2}\n",
     "pair 'p' draft: 'min_ngram' (4) must not exceed 'max_ngram' (2)"),
    (TARGET + "    draft: {kind: ngram, max_ngrm: 2}\n",
     "pair 'p' draft: unknown key 'max_ngrm'; the keys are kind, max_ngram, min_ngram, free"),
    (TARGET + "    draft: {kind: head, source: ./h, lookup: true, sorce: x}\n",
     "pair 'p' draft: unknown key 'sorce'; the keys are kind, source, lookup, free"),
    (TARGET + "    draft: {source: ./d, device: cpu}\n",
     "pair 'p' draft: unknown key 'device'; the keys are kind, source, dtype, device_map, lookup, free"),
    (TARGET + "    draft: {kind: medusa, source: ./d}\n",
     "pair 'p' draft: 'kind' must be one of model, head, ngram, recycle, suffix, store, got 'medusa'"),
    (TARGET + "    draft: [./d]\n", "pair 'p' draft: expected a source string or a mapping with 'source'"),
    (TARGET + "    draft: ngram\n    drafters: {model: {source: ./d, device_map: [0]}}\n",
     "pair 'p' drafters.model: 'device_map' must be a device or a mapping of modules to devices, got [0]"),
    (TARGET + "    draft: ngram\n    drafters: {ngram: {kind: ngram, lookup: true}}\n",
     "pair 'p' drafters.ngram: unknown key 'lookup'; the keys are kind, max_ngram, min_ngram, free"),
    (TARGET + "    draft: ngram\n    scenarios: {code: '5'}\n",
     "pair 'p' scenario 'code': K must be an integer from 0 to {MAX_K}, got '5'"),
    (TARGET + "    draft: ngram\n    scenarios: [code]\n", "pair 'p': 'scenarios' must map scenario names to K"),
    (TARGET + "    draft: ngram\n    profile: [p.yaml]\n", "pair 'p': 'profile' must be a file name, got ['p.yaml']"),
    (TARGET + "    draft: ngram\n    description: {a: b}\n", "pair 'p': 'description' must be a string, got {'a': 'b'}"),
])
def test_nested_keys_of_the_wrong_name_or_type_are_one_line(tmp_path, pair, message):
    from specdec_cli.limits import MAX_K

    models = tmp_path / "models.yaml"
    models.write_text(f"pairs:\n  p:\n{pair}")
    result = runner.invoke(app, ["models", "--models", str(models)])
    assert result.exit_code == 2, result.output
    assert one_line(result) == f"specdec: error: {models}: " + message.replace("{MAX_K}", str(MAX_K))


def test_the_nested_mappings_that_are_right_still_read(tmp_path):
    from specdec_cli.pairs.registry import load_registry

    models = tmp_path / "models.yaml"
    models.write_text("pairs:\n  p:\n    target: {source: ./t, dtype: bfloat16, device_map: {model: 0, lm_head: cpu}}\n"
                      "    draft: {kind: ngram, min_ngram: 2, max_ngram: 4}\n"
                      "    drafters: {model: {kind: model, source: ./d, device_map: cpu, lookup: true}}\n")
    pair = load_registry(models).pair("p")
    assert pair.target.device_map == {"model": 0, "lm_head": "cpu"} and pair.target.dtype == "bfloat16"
    assert (pair.drafter.min_ngram, pair.drafter.max_ngram) == (2, 4)
    assert pair.alternates["model"].lookup and pair.alternates["model"].model.device_map == "cpu"


# --- a calibration profile of the wrong shape -------------------------------------------------------


def profile_with(tmp_path: Path, pair_dir: Path, change) -> str:
    """A profile as `calibrate-k --write` writes it for the tiny pair, then ``change``d by hand."""
    from ruamel.yaml import YAML

    from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, write_profile

    path = tmp_path / "profile.yaml"
    section = ScenarioProfile(k=2, verdict="speculate", best_k=2, speedup=1.5, alpha=0.8, c=0.1, verify_cost={2: 1.2})
    write_profile(path, PairProfile(pair="tiny", calibrated="2026-01-01T00:00:00", target=str(pair_dir / "target"),
                                    draft="ngram", scenarios={"default": section}, overall=section,
                                    versions={"torch": "2.13"}, settings={"k": "0..4"}, drafter={"kind": "ngram"}))
    yaml = YAML(typ="rt")
    data = yaml.load(path.read_text())
    change(data["pairs"]["tiny"])
    with path.open("w") as out:
        yaml.dump(data, out)
    return str(path)


def generate_auto(pair_dir, profile):
    return runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--profile", profile, "-k", "auto",
                               "--max-new-tokens", "2", "x"])


def set_key(key, value, section="default"):
    def change(pair):
        target = pair if section is None else pair["scenarios"][section] if section != "overall" else pair["overall"]
        if value is KeyError:
            del target[key]
        else:
            target[key] = value
    return change


@pytest.mark.parametrize("change, where, problem", [
    (set_key("k", "three"), "scenario 'default'", "'k' must be a whole number from 0 to {MAX_K}, got 'three'"),
    (set_key("k", "3"), "scenario 'default'", "'k' must be a whole number from 0 to {MAX_K}, got '3'"),
    (set_key("k", -1), "scenario 'default'", "'k' must be a whole number from 0 to {MAX_K}, got -1"),
    (set_key("k", 2.5), "scenario 'default'", "'k' must be a whole number from 0 to {MAX_K}, got 2.5"),
    (set_key("best_k", True, "overall"), "overall", "'best_k' must be a whole number from 0 to {MAX_K}, got True"),
    (set_key("k", KeyError), "scenario 'default'", "'k' is missing; recalibrate with `specdec calibrate-k --write`"),
    (set_key("alpha", KeyError), "scenario 'default'", "'alpha' is missing; recalibrate with `specdec calibrate-k --write`"),
    (set_key("alpha", 1.5), "scenario 'default'", "'alpha' must be a number from 0 to 1, got 1.5"),
    (set_key("alpha", "high"), "scenario 'default'", "'alpha' must be a number from 0 to 1, got 'high'"),
    (set_key("c", -0.5), "scenario 'default'", "'c' must be a number of at least 0, got -0.5"),
    (set_key("verdict", "maybe"), "scenario 'default'", "'verdict' must be one of speculate, off, got 'maybe'"),
    (set_key("verify_cost", [1.2]), "scenario 'default'", "'verify_cost' must map each K to a positive number, got [1.2]"),
    (set_key("verify_cost", {"two": 1.2}), "scenario 'default'",
     "'verify_cost' must map each K to a positive number, got {'two': 1.2}"),
    (set_key("versions", ["torch"], None), "", "'versions' must be a mapping, got ['torch']"),
    (set_key("settings", "k 0..4", None), "", "'settings' must be a mapping, got 'k 0..4'"),
    (set_key("drafter", "ngram", None), "", "'drafter' must be a mapping, got 'ngram'"),
    (set_key("computed_by", ["torch"], None), "", "'computed_by' must be a mapping, got ['torch']"),
    (set_key("target", ["t"], None), "", "'target' must be a string, got ['t']"),
    (set_key("scenarios", KeyError, None), "", "needs a 'scenarios' mapping"),
])
def test_a_profile_of_the_wrong_shape_is_one_line_naming_file_and_key(pair_dir, tmp_path, change, where, problem):
    """A malformed profile stops the run with exit 2, as an unreadable one does (profile.py); a stale
    but well-formed one is ignored with a warning (test_ux.py)."""
    from specdec_cli.limits import MAX_K

    profile = profile_with(tmp_path, pair_dir, change)
    result = generate_auto(pair_dir, profile)
    assert result.exit_code == 2, result.output
    where = f"{profile}: profile of pair 'tiny'" + (f" {where}" if where else "")
    separator = " " if problem.startswith("needs") else ": "
    assert one_line(result) == f"specdec: error: {where}{separator}{problem.replace('{MAX_K}', str(MAX_K))}"


def test_a_profile_that_is_a_list_is_one_line(pair_dir, tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text("- tiny\n- k: 3\n")
    result = generate_auto(pair_dir, str(profile))
    assert result.exit_code == 2, result.output
    assert one_line(result) == f"specdec: error: {profile}: not a specdec profile (expected a mapping with a 'pairs' section)"


def test_a_well_formed_profile_still_reads(pair_dir, tmp_path):
    from specdec_cli.pairs.profile import read_profiles

    profile = profile_with(tmp_path, pair_dir, lambda pair: None)
    assert generate_auto(pair_dir, profile).exit_code == 0
    read = read_profiles(Path(profile))["tiny"]
    assert (read.scenarios["default"].k, read.overall.verify_cost, read.drafter) == (2, {2: 1.2}, {"kind": "ngram"})


def test_a_prompt_file_may_be_a_pipe(tmp_path):
    """`--prompts <(grep qa all.jsonl)` hands the command a pipe, which is read once like a file."""
    fifo = tmp_path / "prompts"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=('{"prompt": "first", "scenario": "qa"}\nsecond\n',), daemon=True)
    writer.start()
    assert [(p.text, p.scenario) for p in read_file(fifo)] == [("first", "qa"), ("second", None)]
    writer.join()
