"""`specdec watch [URL]`: a running server's acceptance beside its latency and load, refreshed in
place; `--once --json` for scripts. The figures are serving/watch.py's; this draws them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ..errors import UserError
from .common import plain_console, stderr_console, user_errors


@user_errors
def watch(
    url: Annotated[Optional[str], typer.Argument(metavar="URL", help="The server to watch (default: the newest server specdec started that still runs).")] = None,
    once: Annotated[bool, typer.Option("--once", help="One reading over --interval, printed, then exit.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="The reading as one JSON object on stdout (with --once; else one per line).")] = False,
    interval: Annotated[float, typer.Option("--interval", metavar="S", help="Seconds between readings (the window the rates and interval percentiles cover).")] = 2.0,
    curve: Annotated[Optional[Path], typer.Option("--curve", metavar="BENCH.json", help="`specdec bench --engine vllm --json` output: judge whether speculation pays at the current load from its measured gain.")] = None,
    mode: Annotated[Optional[str], typer.Option("--mode", metavar="MODE", help="The curve's mode this server runs (default: the curve's first speculative mode).")] = None,
) -> None:
    """Watch a serving engine's speculative decoding live: acceptance rate, per-position acceptance,
    mean acceptance length, generation tok/s, TTFT and ITL percentiles, requests running and
    waiting, and whether speculation pays at this load (from a bench curve, --curve).

    vLLM's metric names and SGLang's are recognised. Exit codes: 0 done; 2 bad input or no server.
    """
    from ..serving import metrics
    from ..serving.client import Endpoint, ServerDown
    from ..serving.server import attach, running_servers
    from ..serving.watch import figures, judgement

    if interval <= 0:
        raise UserError(f"--interval must be above 0, got {interval}")
    bench_curve = _read_curve(curve) if curve else None
    if url is None:
        found = running_servers()
        if not found:
            raise UserError("no server specdec started is running: give the URL of one (specdec watch http://HOST:PORT)")
        endpoint = Endpoint(found[0]["url"])
        mode = mode or found[0]["mode"]
    else:
        endpoint = attach(url)

    def reading(before):
        time.sleep(interval)
        after = metrics.scrape(endpoint)
        shown = figures(after, after.minus(before))
        shown["url"] = endpoint.url
        shown["break_even"] = judgement(bench_curve, mode, shown["running"])
        return after, shown

    try:
        snapshot = metrics.scrape(endpoint)
        if once:
            _, shown = reading(snapshot)
            print(json.dumps(shown)) if json_out else plain_console().print(render(shown))
            return
        if json_out:
            while True:
                snapshot, shown = reading(snapshot)
                print(json.dumps(shown), flush=True)
        with Live(console=_console(), auto_refresh=False, transient=False) as live:
            while True:
                snapshot, shown = reading(snapshot)
                live.update(render(shown), refresh=True)
    except ServerDown as exc:
        raise UserError(f"the server at {endpoint.url} stopped answering: {exc}") from None
    except KeyboardInterrupt:
        return


def _console() -> Console:
    """The live view draws on stderr, as generate's does (rich honours NO_COLOR); --once prints on stdout."""
    return stderr_console()


def _read_curve(path: Path) -> dict:
    try:
        curve = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--curve {path}: not a bench JSON file ({exc})") from None
    if "gain" not in curve:
        raise UserError(f"--curve {path}: no 'gain' in it; give the output of `specdec bench --engine vllm --json`")
    return curve


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:.2f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def render(shown: dict) -> Group:
    """Short lines (each fits 60 columns), so a narrow terminal keeps one figure per line."""
    a = shown["acceptance"]
    positions = " ".join(f"{p:.2f}" for p in a.get("per_position") or []) or "–"
    lines = [
        Text(f"{shown['url']} ({shown['engine']}), every {shown['window_s']:.1f} s", style="bold"),
        Text(f"acceptance {_fmt(a.get('acceptance_rate'))}  α {_fmt(a.get('alpha'))}  "
             f"mean length {_fmt(a.get('mean_acceptance_length'))} ({shown['acceptance_scope']})"),
        Text(f"per position {positions}"),
        Text(f"generation {_fmt(shown['generation_tok_s'])} tok/s  running {shown['running']}  waiting {shown['waiting']}"),
        Text(f"TTFT p50 {_fmt(shown['ttft']['p50_ms'])}  p99 {_fmt(shown['ttft']['p99_ms'])} ms ({shown['ttft']['scope']})"),
        Text(f"ITL  p50 {_fmt(shown['itl']['p50_ms'])}  p99 {_fmt(shown['itl']['p99_ms'])} ms ({shown['itl']['scope']})"),
    ]
    verdict = shown["break_even"]
    style = "bold red" if verdict["paying"] is False else "green" if verdict["paying"] else "dim"
    lines.append(Text(("warning: " if verdict["paying"] is False else "") + verdict["text"], style=style))
    return Group(*lines)
