"""A completions client on the standard library: streamed requests with bounded timeouts, the timing
of every chunk (TTFT, inter-token gaps, end-to-end), the token ids, and failures classified rather
than raised. Two dialects, one loop: OpenAI's /v1/completions (vLLM's ``return_token_ids``) and
llama.cpp's own /completion, the one of its endpoints that returns token ids and lets a request
turn the prompt cache off."""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from ..errors import UserError, json_type

REQUEST_TIMEOUT_S = 120.0  # a whole request, and the longest silence between two chunks


class ServerDown(Exception):
    """Nothing answers at the endpoint (refused, reset, timed out)."""


class NotAnEngine(UserError):
    """Something answers at the endpoint, but not as a serving engine does (a web page, another API):
    one line naming the address and what came instead, for every command that asks (watch, bench and
    verify against a server), not a traceback from deep in the parsing."""


@dataclass(frozen=True)
class Endpoint:
    url: str  # http://host:port, without /v1
    api_key: str | None = field(default=None, repr=False)  # never printed
    userinfo: str | None = field(default=None, repr=False)  # the URL's user:password, never printed: Basic auth
    model: str | None = None
    dialect: str = "openai"  # or "llama.cpp" (DIALECTS)

    @property
    def port(self) -> int:
        return urlparse(self.url).port or 80

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        elif self.userinfo:
            user, _, password = self.userinfo.partition(":")
            headers["Authorization"] = "Basic " + base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
        return headers

    def models(self) -> list[str]:
        where = f"{self.url}/v1/models"
        body = get_json(self, "/v1/models", timeout=10.0)
        if not isinstance(body, dict):
            raise NotAnEngine(f"{where} answered a JSON {json_type(body)}, not an engine's model list (an object with 'data')")
        entries = body.get("data", [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("id"), str) for e in entries):
            raise NotAnEngine(f"{where} answered a model list without model ids")
        return [entry["id"] for entry in entries]


# A URL's scheme, then its userinfo: the authority (up to the first / ? or #) up to its last @ (RFC 3986).
USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s]*)@")


def without_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` less its ``user:password@``, which nothing prints (a password on the screen, in a log or
    a manifest is a password given away), and that userinfo, or None."""
    match = USERINFO.match(url)
    if not match:
        return url, None
    return match[1] + url[match.end():], match[2]


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an endpoint's (urllib would raise mid-request, or read it as another
    address), or None."""
    try:
        parsed = urlparse(url)
        _ = parsed.port  # a port that is no number, or out of range, raises here
    except ValueError as exc:
        return str(exc)
    return None if parsed.hostname else "no host"


def get(endpoint: Endpoint, path: str, timeout: float = 10.0) -> str:
    request = urllib.request.Request(endpoint.url + path, headers=endpoint.headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        raise ServerDown(f"HTTP {exc.code} on {path}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise ServerDown(_why(exc)) from None


def get_json(endpoint: Endpoint, path: str, timeout: float = 10.0):
    """A JSON answer; anything else (a web page, plain text) is NotAnEngine, naming what came instead."""
    text = get(endpoint, path, timeout)
    try:
        return json.loads(text)
    except ValueError:
        raise NotAnEngine(f"{endpoint.url}{path} answered {body_kind(text)}, not an engine's JSON") from None


def body_kind(text: str) -> str:
    """What a page that is not the expected one looks like, in a word or two."""
    head = text.lstrip()
    if not head:
        return "an empty page"
    if head.startswith("<"):
        return "HTML"
    try:
        json.loads(text)
    except ValueError:
        return "text"
    return "JSON"


@dataclass
class Completion:
    """One request's outcome and timing; ``error`` is a failure kind (timeout, connection, http-500,
    incomplete, malformed: a chunk that is not an engine's) or None."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    output_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between successive chunks
    top_logprobs: list[dict[str, float]] = field(default_factory=list)  # per position ('token_id:N' keys), when asked
    finish_reason: str | None = None
    drafted: int | None = None  # draft tokens the server says it verified for this request (llama.cpp's timings)
    accepted: int | None = None
    error: str | None = None
    detail: str = ""

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, as `vllm bench serve` defines it."""
        if self.error or self.ttft_s is None or self.latency_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def complete(endpoint: Endpoint, prompt_ids: list[int], max_tokens: int, *, logprobs: int | None = None,
             ignore_eos: bool = False, timeout_s: float = REQUEST_TIMEOUT_S) -> Completion:
    """One greedy completion, streamed. Never raises for the server's faults: they come back as ``error``."""
    dialect = DIALECTS[endpoint.dialect]
    request = urllib.request.Request(endpoint.url + dialect.path,
                                     data=json.dumps(dialect.body(endpoint, prompt_ids, max_tokens, logprobs, ignore_eos)).encode(),
                                     headers=endpoint.headers(), method="POST")
    result = Completion()
    started = time.perf_counter()
    last = started
    try:
        with urllib.request.urlopen(request, timeout=min(timeout_s, REQUEST_TIMEOUT_S)) as response:
            for raw in response:
                if time.perf_counter() - started > timeout_s:
                    result.error, result.detail = "timeout", f"over {timeout_s:.0f} s"
                    return result
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    carried = dialect.take(result, json.loads(data))
                except (ValueError, TypeError, KeyError, AttributeError) as exc:  # not an engine's chunk
                    result.error = "malformed"
                    result.detail = f"{endpoint.url}{dialect.path} streamed a chunk that is not an engine's ({_why(exc)})"
                    return result
                if carried:
                    if result.ttft_s is None:
                        result.ttft_s = now - started
                    else:
                        result.itl_s.append(now - last)
                    last = now
    except urllib.error.HTTPError as exc:
        result.error, result.detail = f"http-{exc.code}", _body(exc)
        return result
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        result.error = "timeout" if isinstance(getattr(exc, "reason", exc), (socket.timeout, TimeoutError)) else "connection"
        result.detail = _why(exc)
        return result
    result.latency_s = time.perf_counter() - started
    if result.finish_reason is None:
        result.error, result.detail = "incomplete", "the stream ended without a finish reason"
    result.output_tokens = result.output_tokens or len(result.token_ids)
    return result


class OpenAICompletions:
    """/v1/completions, greedy, with vLLM's extensions for token ids (ignored by servers without them)."""

    path = "/v1/completions"

    @staticmethod
    def body(endpoint: Endpoint, prompt_ids: list[int], max_tokens: int, logprobs: int | None, ignore_eos: bool) -> dict:
        body = {"model": endpoint.model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
                "ignore_eos": ignore_eos}
        if logprobs is not None:
            body.update(logprobs=logprobs, return_tokens_as_token_ids=True)  # keys 'token_id:N', not text
        return body

    @staticmethod
    def take(result: Completion, chunk: dict) -> bool:
        """Fold one streamed chunk in; True when it carried generated tokens."""
        if chunk.get("usage"):
            result.output_tokens = chunk["usage"].get("completion_tokens") or result.output_tokens
        carried = False
        for choice in chunk.get("choices") or []:
            ids = choice.get("token_ids") or []
            text = choice.get("text") or ""
            result.token_ids += ids
            result.text += text
            carried = carried or bool(ids or text)
            logprobs = choice.get("logprobs") or {}
            result.top_logprobs += [dict(top or {}) for top in logprobs.get("top_logprobs") or []]
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
        return carried


class LlamaCompletions:
    """llama.cpp's /completion, greedy. ``cache_prompt`` off: every request computes its whole
    prompt, so that its output does not depend on what the slot served before (with the cache on,
    the same prompt sent twice can come back different) and every mode pays the same prefill."""

    path = "/completion"
    FINISH = {"eos": "stop", "word": "stop", "limit": "length"}

    @staticmethod
    def body(endpoint: Endpoint, prompt_ids: list[int], max_tokens: int, logprobs: int | None, ignore_eos: bool) -> dict:
        return {"prompt": prompt_ids, "n_predict": max_tokens, "temperature": 0.0, "stream": True,
                "return_tokens": True, "cache_prompt": False, "ignore_eos": ignore_eos, "n_probs": logprobs or 0}

    @classmethod
    def take(cls, result: Completion, chunk: dict) -> bool:
        ids = chunk.get("tokens") or []
        result.token_ids += ids
        result.text += chunk.get("content") or ""
        for position in chunk.get("completion_probabilities") or []:
            result.top_logprobs.append({f"token_id:{top['id']}": top["logprob"] for top in position.get("top_logprobs") or []})
        if chunk.get("stop"):
            result.finish_reason = cls.FINISH.get(chunk.get("stop_type"), chunk.get("stop_type") or "stop")
            result.output_tokens = chunk.get("tokens_predicted") or result.output_tokens
            timings = chunk.get("timings") or {}
            result.drafted, result.accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
        return bool(ids)


DIALECTS = {"openai": OpenAICompletions, "llama.cpp": LlamaCompletions}


def _body(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode(errors="replace")[:300]
    except OSError:
        return ""


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    return str(reason) or type(reason).__name__
