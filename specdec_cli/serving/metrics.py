"""A server's Prometheus page as numbers: speculative-decoding counters (vLLM's, llama.cpp's read
under vLLM's names, SGLang's gauges), token counters, request gauges and latency histograms, taken
as snapshots and differenced over a window. Parsing is prometheus_client's; the arithmetic is in stats.py."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from .client import Endpoint, NotAnEngine, body_kind, get

# vLLM (v1) names; the _total suffix is how its counters are exported.
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
              "e2e": "vllm:e2e_request_latency_seconds"}
OLD_ITL = "vllm:time_per_output_token_seconds"  # the inter-token histogram's name before v1
# llama-server's (--metrics): the same counts under its own names, read as vLLM's; it keeps no latency histograms.
LLAMA_CPP = {"llamacpp:spec_decode_num_drafts_total": DRAFTS, "llamacpp:spec_decode_num_draft_tokens_total": DRAFT_TOKENS,
             "llamacpp:spec_decode_num_accepted_tokens_total": ACCEPTED,
             "llamacpp:spec_decode_num_accepted_tokens_per_pos_total": ACCEPTED_PER_POS,
             "llamacpp:tokens_predicted_total": GENERATION_TOKENS, "llamacpp:requests_processing": RUNNING,
             "llamacpp:requests_deferred": WAITING}
SGLANG = {"accept_length": "sglang:spec_accept_length", "accept_rate": "sglang:spec_accept_rate",
          "running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs",
          "generation_tokens": "sglang:generation_tokens_total"}


@dataclass
class Snapshot:
    """Every sample on the page, summed over label sets except the ones kept (position, le)."""

    samples: dict[tuple[str, str], float] = field(default_factory=dict)  # (name, position or le or "") -> value
    taken: float = field(default_factory=time.monotonic)
    engine: str = "vllm"  # whose names the page used: vllm (and SGLang's, told by has()), llama.cpp

    def value(self, name: str, key: str = "") -> float:
        return self.samples.get((name, key), 0.0)

    def has(self, name: str) -> bool:
        return any(sample == name for sample, _ in self.samples)

    def per_position(self) -> list[float]:
        found = sorted((int(key), value) for (name, key), value in self.samples.items() if name == ACCEPTED_PER_POS and key)
        return [value for _, value in found]

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """(upper bound, cumulative count) of a histogram, in order, +Inf last."""
        found = [(float(key), value) for (sample, key), value in self.samples.items() if sample == name + "_bucket"]
        return sorted(found)

    def minus(self, earlier: "Snapshot") -> "Snapshot":
        """Counters and histograms over the window between two snapshots (gauges: the later value)."""
        delta = {key: value - earlier.samples.get(key, 0.0) if _cumulative(key[0]) else value
                 for key, value in self.samples.items()}
        return Snapshot(delta, self.taken - earlier.taken, self.engine)


def _cumulative(name: str) -> bool:
    return name.endswith(("_total", "_bucket", "_count", "_sum"))


def parse(text: str) -> Snapshot:
    """ValueError, in words, for a page that is not Prometheus text or whose labels specdec reads as
    numbers are not numbers (they would fail later, mid-figures)."""
    snapshot = Snapshot()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if math.isnan(sample.value):
                continue
            key = sample.labels.get("position") or sample.labels.get("le") or ""
            name = LLAMA_CPP.get(sample.name, sample.name)
            _check_sample(name, key, sample.value)
            if sample.name.startswith("llamacpp:"):
                snapshot.engine = "llama.cpp"
            if name.endswith("_created"):  # a timestamp, not a count
                continue
            snapshot.samples[(name, key)] = snapshot.samples.get((name, key), 0.0) + sample.value
    return snapshot


def _check_sample(name: str, key: str, value: float) -> None:
    """A per-position counter's position is a whole number, a bucket's bound a number, an engine's value finite."""
    if name == ACCEPTED_PER_POS and key and not key.isdigit():
        raise ValueError(f"position={key!r} is not a whole number")
    if name.endswith("_bucket"):
        try:
            float(key)
        except ValueError:
            raise ValueError(f"bucket bound le={key!r} is not a number") from None
    if math.isinf(value) and name.startswith(("vllm:", "sglang:")):  # the figures count them as whole numbers
        raise ValueError(f"{name} is {value}")


def scrape(endpoint: Endpoint, timeout: float = 10.0) -> Snapshot:
    """The page as a Snapshot; a page that is not an engine's metrics is NotAnEngine (one line, exit 2)."""
    text = get(endpoint, "/metrics", timeout=timeout)
    try:
        return parse(text)
    except ValueError as exc:
        raise NotAnEngine(not_metrics(f"{endpoint.url}/metrics", text, exc)) from None


def not_metrics(where: str, text: str, exc: ValueError) -> str:
    kind = body_kind(text)
    if kind != "text":
        return f"{where} answered {kind}, not an engine's Prometheus metrics"
    return f"{where} answered text that is not Prometheus metrics ({str(exc)[:120]})"


def itl_histogram(snapshot: Snapshot) -> str:
    return HISTOGRAMS["itl"] if snapshot.buckets(HISTOGRAMS["itl"]) else OLD_ITL
