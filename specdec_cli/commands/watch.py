"""`specdec watch [URL]`: a running server's acceptance beside its latency and load, refreshed in
place; `--once --json` for scripts. The figures are serving/watch_figures.py's; this draws them."""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from . import interrupt
from ..errors import UserError, read_json
from .common import check_number, plain_console, resolve_pair, stderr_console, user_errors

MOST_INTERVAL_S = 86400.0  # a reading a day; far beyond it time.sleep overflows (past 2⁶³ ns), and nan or inf was a traceback


@user_errors
def watch(
    url: Annotated[Optional[str], typer.Argument(metavar="URL", help="The server to watch (default: the newest server specdec started that still runs).")] = None,
    once: Annotated[bool, typer.Option("--once", help="One reading over --interval, printed, then exit.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="The reading as one JSON object on stdout (with --once; else one per line).")] = False,
    interval: Annotated[float, typer.Option("--interval", metavar="S", help="Seconds between readings (the window the rates and interval percentiles cover).")] = 2.0,
    curve: Annotated[Optional[Path], typer.Option("--curve", metavar="BENCH.json", help="`specdec bench --engine vllm --json` output: judge whether speculation pays at the current load from its measured gain.")] = None,
    mode: Annotated[Optional[str], typer.Option("--mode", metavar="MODE", help="The curve's mode this server runs (default: the curve's first speculative mode).")] = None,
    export: Annotated[Optional[Path], typer.Option("--export", metavar="FILE", help="`specdec export --engine vllm --json` output, or its --out file: compare the K it recommends at the current load with the K the server drafts, and the server's α with the calibrated one (drift).")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", metavar="FILE", help="Calibration profile to judge drift against (with --export). Default: the one the export names, else the pair's as `specdec export` finds it.")] = None,
) -> None:
    """Watch a serving engine's speculative decoding live: acceptance rate, per-position acceptance,
    mean acceptance length, generation tok/s, TTFT and ITL percentiles, requests running and
    waiting, and whether speculation pays at this load (from a bench curve, --curve). With --export,
    the K the export recommends beside the K the server drafts, and a warning when the server's
    acceptance left the profile's calibrated interval (traffic drifted: recalibrate, export again).

    vLLM's metric names, llama.cpp's (llama-server --metrics; it keeps no latency histograms) and
    SGLang's are recognised. Exit codes: 0 done; 2 bad input or no server; 130 stopped by Ctrl-C.
    """
    from ..serving import metrics
    from ..serving.client import Endpoint, ServerDown
    from ..serving.server import attach, running_servers
    from ..serving.drift import recommendation
    from ..serving.watch_figures import acceptance_scope, figures, judgement

    check_number("--interval", interval, 0, MOST_INTERVAL_S, above=True)
    if profile is not None and export is None:
        raise UserError("--profile judges drift from an export's recommendation: give --export FILE too")
    bench_curve = _read_curve(curve) if curve else None
    schedule, calibrated = None, None
    if export is not None:
        data, schedule = _read_export(export)
        calibrated = _calibrated(profile, data)
    if url is None:
        found = running_servers()
        if not found:
            raise UserError("no server specdec started is running: give the URL of one (specdec watch http://HOST:PORT)")
        endpoint = Endpoint(found[0]["url"])
        mode = mode or found[0]["mode"]
    else:
        endpoint = attach(url, "URL")

    def reading(before):
        time.sleep(interval)
        after = metrics.scrape(endpoint)
        shown = figures(after, after.minus(before))
        shown["url"] = endpoint.url
        shown["break_even"] = judgement(bench_curve, mode, shown["running"])
        if schedule is not None and shown["engine"] == "vllm":  # SGLang exports no draft counters
            spec, scope = acceptance_scope(after, after.minus(before))
            shown["recommendation"] = recommendation(schedule, calibrated.band, spec, scope, shown["running"],
                                                     calibrated.about, calibrated.notes)
        return after, shown

    interrupt.now(f"watching {endpoint.url}", "no reading was shown")
    try:
        snapshot = metrics.scrape(endpoint)
        if once:
            _, shown = reading(snapshot)
            print(json.dumps(shown)) if json_out else plain_console().print(render(shown))
            return
        if json_out:
            for count in itertools.count(1):
                snapshot, shown = reading(snapshot)
                interrupt.now(f"watching {endpoint.url}", _readings(count))
                print(json.dumps(shown), flush=True)
        with Live(console=_console(), auto_refresh=False, transient=False) as live:
            for count in itertools.count(1):
                snapshot, shown = reading(snapshot)
                interrupt.now(f"watching {endpoint.url}", _readings(count))
                live.update(render(shown), refresh=True)
    except ServerDown as exc:
        raise UserError(f"the server at {endpoint.url} stopped answering: {exc}") from None


def _readings(count: int) -> str:
    """What Ctrl-C keeps of a watch: the readings on the screen (the last one stays drawn)."""
    return "1 reading was shown" if count == 1 else f"{count} readings were shown"


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


def _read_export(path: Path):
    from ..serving.drift import schedule_from

    data = read_json(path, "--export")
    try:
        return data, schedule_from(data)
    except ValueError as exc:
        raise UserError(f"--export {path}: {exc}; give the output of `specdec export --engine vllm --json` "
                        "or the file its --out wrote") from None


@dataclass(frozen=True)
class Calibrated:
    band: object  # drift.Band, or None when no profile was found
    about: str  # which profile, or why there is none
    notes: tuple[str, ...] = ()


ORIGIN = re.compile(r"profile (?P<path>.+?) \(pair '(?P<section>[^']+)', calibrated")
ENGINE_METHOD = {"head": "eagle3", "model": "draft_model", "ngram": "ngram"}


def _calibrated(explicit: str | None, data) -> Calibrated:
    """The profile to judge drift against: --profile, else the one the export's origin names, else
    the pair's (the export's pair, else the default one) where `specdec export` finds it. Its α is
    the overall one (engines serve every scenario with one K), else its only scenario's."""
    from ..pairs.profile import profile_path, read_profiles, section_name
    from ..serving.drift import profile_band

    named = None
    if isinstance(data, dict):  # the export's own record of its profile, else the one its origin names
        recorded = data.get("profile")
        named = recorded if isinstance(recorded, dict) and {"path", "section"} <= set(recorded) else \
            ORIGIN.search(str(data.get("origin", "")))
    path = Path(explicit).expanduser() if explicit else Path(named["path"]) if named else None
    if explicit and not path.is_file():
        raise UserError(f"--profile file not found: {path}")
    section = named["section"] if named else None
    if path is None or section is None:
        pair = data.get("pair") if isinstance(data, dict) and isinstance(data.get("pair"), str) else None
        try:
            spec = resolve_pair(None, pair)
        except UserError:
            spec = None
        if spec is not None:
            path, section = path or profile_path(None, spec), section or section_name(spec)
    if path is None or not path.is_file():
        return Calibrated(None, f"no calibration profile at {path}" if path else "no calibration profile found")
    profiles = read_profiles(path)
    found = profiles.get(section) if section else None
    if found is None and len(profiles) == 1:
        found = next(iter(profiles.values()))
    part = found and (found.overall or next(iter(found.scenarios.values()), None))
    if part is None:
        if explicit:
            raise UserError(f"--profile {path}: no profile of pair {section!r} in it (it has: {', '.join(profiles) or 'none'})")
        return Calibrated(None, f"no profile of pair {section!r} in {path}")
    settings = found.settings
    band = profile_band(part.alpha, settings.get("prompt_count"), settings.get("max_new_tokens"), settings.get("k"))
    notes = []
    if found.drafter.get("lookup") and found.drafter.get("kind") != "ngram":
        notes.append("the profile ran prompt lookup before its drafter; the engine runs the drafter alone, so a lower α is expected")
    method = data.get("speculative_config", data) if isinstance(data, dict) else {}
    kind = ENGINE_METHOD.get(str(found.drafter.get("kind")))
    if isinstance(method, dict) and method.get("method") and kind and kind != method["method"]:
        notes.append(f"the profile measured a {found.drafter.get('kind')} drafter; the export drafts with {method['method']}")
    return Calibrated(band, f"profile {path} (pair {found.pair!r}, calibrated {found.calibrated})", tuple(notes))


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
    if "recommendation" in shown:
        rec, drift = shown["recommendation"], shown["recommendation"]["drift"]
        lines.append(Text(rec["text"], style="bold red" if rec["agree"] is False else ""))
        style = "bold red" if drift["warning"] else "green" if drift["verdict"] == "inside" else "dim"
        lines.append(Text(("warning: " if drift["warning"] else "drift: ") + drift["text"], style=style))
    return Group(*lines)
