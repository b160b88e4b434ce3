"""The bill of a lossy acceptance rule, against the same mode decoding losslessly.

Relaxed rules raise acceptance, and acceptance is the number usually quoted; it is not what the
user pays for. Per lossy bench mode this puts beside the per-round gain (ℓ+1)/(ℓ*+1) what it buys and
costs: completion length, verify rounds, wall time, tokens/s, the target's NLL of the text, accuracy
on checkable tasks, and how often the output is still the lossless one. Every figure carries a 95 %
paired bootstrap interval over prompts: both modes ran the same prompts with the same seeds, so a
prompt is resampled with both of its results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .tasks import is_correct

ROUNDS = 2000  # bootstrap resamples
LEVEL = 0.95


def bootstrap_interval(statistic: Callable[[np.ndarray], float], n: int, rounds: int = ROUNDS, seed: int = 0,
                       level: float = LEVEL) -> tuple[float, float, float]:
    """The statistic on all n units, and the percentile interval of it over resamples of the units.

    ``statistic`` takes an array of unit indices; applying the same indices to both modes' arrays is
    what makes the interval paired.
    """
    point = float(statistic(np.arange(n)))
    rng = np.random.default_rng(seed)
    draws = np.array([statistic(rng.integers(0, n, n)) for _ in range(rounds)], dtype=float)
    low, high = np.nanpercentile(draws, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return point, float(low), float(high)


def target_nll(model, prompt_ids: list[int], tokens: list[int]) -> float:
    """Sum over ``tokens`` of −log p_target(token | prompt, earlier tokens), at temperature 1: how far
    the text drifted from what the target would write. One forward; never inside a timed region."""
    if not tokens:
        return 0.0
    import torch  # here, so that the report's formatting answers without torch

    from ..decoding.kv import input_device

    ids = torch.tensor([prompt_ids + tokens], device=input_device(model))
    vocab = model.config.get_text_config().vocab_size
    with torch.inference_mode():
        logits = model(ids, logits_to_keep=len(tokens) + 1).logits[0, :-1, :vocab].float()
    logp = torch.log_softmax(logits, dim=-1)
    return float(-logp[torch.arange(len(tokens)), torch.tensor(tokens, device=logp.device)].sum())


def score(sample, model, tokenizer, prompt_ids: list[int]) -> None:
    """Fill a bench sample's quality fields: NLL of its text, and correctness where the prompt has an answer."""
    sample.nll = target_nll(model, prompt_ids, sample.tokens)
    if sample.prompt.answer is not None:
        sample.correct = is_correct(sample.prompt.answer, tokenizer.decode(sample.tokens, skip_special_tokens=True))


@dataclass
class PerPrompt:
    """One mode's results summed per prompt over its samples (arrays indexed by prompt)."""

    tokens: np.ndarray
    rounds: np.ndarray
    accepted: np.ndarray
    wall: np.ndarray
    nll: np.ndarray
    correct: np.ndarray  # share of samples correct; NaN for a prompt without an answer
    identical: np.ndarray  # share of samples identical to the other mode's (filled by compare)


def per_prompt(samples: list, draws: int) -> PerPrompt:
    """Samples in run order (prompt by prompt, ``draws`` each) folded per prompt."""
    def fold(values) -> np.ndarray:
        return np.asarray(values, dtype=float).reshape(-1, draws).sum(axis=1)

    correct = np.asarray([np.nan if s.correct is None else float(s.correct) for s in samples]).reshape(-1, draws).mean(1)
    return PerPrompt(fold([len(s.tokens) for s in samples]), fold([s.rounds for s in samples]),
                     fold([s.accepted for s in samples]), fold([s.wall_s for s in samples]),
                     fold([s.nll or 0.0 for s in samples]), correct, np.zeros(len(samples) // draws))


def _ratio(a: np.ndarray, b: np.ndarray):
    return lambda i: a[i].sum() / b[i].sum() if b[i].sum() else np.nan


def metrics(lossy: PerPrompt, base: PerPrompt) -> dict[str, Callable[[np.ndarray], float]]:
    """Each reported figure as a statistic of resampled prompt indices."""
    ell = lambda m: (lambda i: m.accepted[i].sum() / m.rounds[i].sum())  # noqa: E731
    nll = lambda m: (lambda i: m.nll[i].sum() / m.tokens[i].sum())  # noqa: E731
    tps = lambda m: (lambda i: m.tokens[i].sum() / m.wall[i].sum())  # noqa: E731
    return {
        "accepted_per_round": ell(lossy),
        "accepted_per_round_lossless": ell(base),
        "per_round_gain": lambda i: (ell(lossy)(i) + 1) / (ell(base)(i) + 1),
        "length_ratio": _ratio(lossy.tokens, base.tokens),
        "rounds_ratio": _ratio(lossy.rounds, base.rounds),
        "wall_ratio": _ratio(lossy.wall, base.wall),
        "tokens_per_s_ratio": lambda i: tps(lossy)(i) / tps(base)(i),
        "nll": nll(lossy),
        "nll_lossless": nll(base),
        "nll_change": lambda i: nll(lossy)(i) - nll(base)(i),
        "identical_share": lambda i: lossy.identical[i].mean(),
    }


def task_metrics(lossy: PerPrompt, base: PerPrompt) -> dict[str, Callable[[np.ndarray], float]]:
    """Accuracy in points, over the prompts that carry an answer only (indices into those)."""
    keep = ~np.isnan(lossy.correct)
    a, b = lossy.correct[keep], base.correct[keep]
    return {"accuracy": lambda i: 100 * a[i].mean(), "accuracy_lossless": lambda i: 100 * b[i].mean(),
            "accuracy_change": lambda i: 100 * (a[i].mean() - b[i].mean())}


def compare(lossy_samples: list, base_samples: list, draws: int, seed: int = 0) -> dict:
    """One lossy mode against its lossless twin: every figure with its paired 95 % interval."""
    lossy, base = per_prompt(lossy_samples, draws), per_prompt(base_samples, draws)
    same = [float(s.tokens == b.tokens) for s, b in zip(lossy_samples, base_samples)]
    lossy.identical = np.asarray(same).reshape(-1, draws).mean(1)
    n = len(lossy.tokens)
    result = {name: _interval(fn, n, seed) for name, fn in metrics(lossy, base).items()}
    tasks = int((~np.isnan(lossy.correct)).sum())
    if tasks:
        result.update({name: _interval(fn, tasks, seed) for name, fn in task_metrics(lossy, base).items()})
    return {"prompts": n, "task_prompts": tasks, "samples": draws, **result}


def _interval(statistic, n: int, seed: int) -> dict:
    with np.errstate(divide="ignore", invalid="ignore"):
        value, low, high = bootstrap_interval(statistic, n, seed=seed)
    return {"value": round(value, 4), "low": round(low, 4), "high": round(high, 4)}


def _fmt(figure: dict | None, spec: str, prefix: str = "", suffix: str = "") -> str:
    if figure is None:
        return "–"
    return (f"{prefix}{figure['value']:{spec}}{suffix} "
            f"[{figure['low']:{spec}}, {figure['high']:{spec}}]")


def cell(figure: dict | None) -> str:
    return _fmt(figure, ".2f")


def headline(mode: str, figures: dict) -> str:
    """One line: what the acceptance figure promises against what the user gets and loses."""
    parts = [f"`{mode}`: per-round gain {_fmt(figures['per_round_gain'], '.2f', suffix='×')}",
             f"real speed-up {_fmt(figures['tokens_per_s_ratio'], '.2f', suffix='×')} tokens/s, "
             f"wall time {_fmt(figures['wall_ratio'], '.2f', suffix='×')}",
             f"length {_fmt(figures['length_ratio'], '.2f', suffix='×')}, rounds {_fmt(figures['rounds_ratio'], '.2f', suffix='×')}",
             f"NLL {_fmt(figures['nll_change'], '+.3f')} nats/token"]
    if "accuracy_change" in figures:
        parts.append(f"accuracy {_fmt(figures['accuracy_change'], '+.1f')} points "
                     f"({figures['accuracy_lossless']['value']:.0f} % → {figures['accuracy']['value']:.0f} %)")
    parts.append(f"identical to lossless {figures['identical_share']['value']:.0%}")
    return "; ".join(parts)


COLUMNS = [("ℓ", "accepted_per_round"), ("ℓ*", "accepted_per_round_lossless"), ("gain (ℓ+1)/(ℓ*+1)", "per_round_gain"),
           ("tok/s ×", "tokens_per_s_ratio"), ("wall ×", "wall_ratio"), ("length ×", "length_ratio"),
           ("rounds ×", "rounds_ratio"), ("NLL", "nll"), ("NLL*", "nll_lossless"), ("ΔNLL", "nll_change"),
           ("acc %", "accuracy"), ("acc* %", "accuracy_lossless"), ("Δacc pts", "accuracy_change"),
           ("= lossless", "identical_share")]


def markdown_section(report: dict) -> list[str]:
    """The lossy part of the bench page: headlines, then every figure with its interval."""
    if not report:
        return []
    lines = ["## Lossy rules against the same mode lossless", "",
             "Each lossy mode is compared with its lossless twin on the same prompts and seeds; "
             "brackets are 95 % paired bootstrap intervals over prompts. `*` marks the lossless twin.", ""]
    lines += [f"- {headline(mode, figures)}" for mode, figures in report.items()] + [""]
    lines += ["| mode | against | " + " | ".join(h for h, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for mode, f in report.items():
        cells = [cell(f.get(key)) for _, key in COLUMNS]
        lines.append(f"| {mode} | {f['against']} | " + " | ".join(cells) + " |")
    return lines + [""]
