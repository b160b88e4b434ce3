"""The calibration curve as a PNG: speed-up (measured and predicted) and acceptance against K; and
`specdec predict`'s predicted curve beside the break-even acceptance.

matplotlib is imported here only, with a file-only backend, so that nothing else pays its start-up.
"""

from __future__ import annotations

import io
from pathlib import Path

from ..atomic import write_atomically
from .calibration import ScenarioResult


def plot_calibration(scenarios: dict[str, ScenarioResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (speed, accept) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, (name, result) in enumerate(scenarios.items()):
        colour = f"C{index}"
        ks = [f.k for f in result.per_k]
        speed.plot(ks, [f.speedup for f in result.per_k], "o-", color=colour, label=f"{name} (measured)")
        speed.plot(ks, [f.predicted_speedup for f in result.per_k], "--", color=colour, alpha=0.6,
                   label=f"{name} (predicted)")
        drafted = [f for f in result.per_k if f.k > 0]
        accept.plot([f.k for f in drafted], [f.alpha for f in drafted], "o-", color=colour, label=f"{name} α")
        accept.plot([f.k for f in drafted], [f.acceptance_rate for f in drafted], ":", color=colour,
                    label=f"{name} accepted/drafted")
    speed.axhline(1.0, color="grey", linewidth=0.8)
    speed.set(xlabel="K (draft tokens per round)", ylabel="speed-up over K=0", title="speed-up")
    accept.set(xlabel="K (draft tokens per round)", ylabel="acceptance", ylim=(0, 1.05), title="acceptance")
    for axes in (speed, accept):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    figure.suptitle(f"specdec calibrate-k · {title}")
    figure.tight_layout()
    save_figure(figure, path)


def plot_prediction(per_rule: dict, alphas: dict[str, float], path: Path, title: str) -> None:
    """`specdec predict --plot`: predicted speed-up against K per rule (``per_rule``: rule → its
    measure/prediction.KPrediction list), and the break-even acceptance per K beside each rule's α."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (speed, even) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, (rule, predictions) in enumerate(per_rule.items()):
        ks = [p.k for p in predictions]
        speed.plot(ks, [p.speedup for p in predictions], "o-", color=f"C{index}", label=f"{rule} (α {alphas[rule]:.2f})")
        even.axhline(alphas[rule], color=f"C{index}", linestyle="--", label=f"α, {rule}")
    first = next(iter(per_rule.values()))
    shown = [p for p in first if p.break_even_alpha is not None]
    even.plot([p.k for p in shown], [p.break_even_alpha for p in shown], "o-", color="grey", label="break-even α")
    speed.axhline(1.0, color="grey", linewidth=0.8)
    speed.set(xlabel="K (draft tokens per round)", ylabel="predicted speed-up over plain", title="predicted speed-up")
    even.set(xlabel="K (draft tokens per round)", ylabel="acceptance α", ylim=(0, 1.05),
             title="K pays where α is above the break-even")
    for axes in (speed, even):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    figure.suptitle(f"specdec predict · {title}")
    figure.tight_layout()
    save_figure(figure, path)


def save_figure(figure, path: Path) -> None:
    """Render ``figure`` in the format its name's suffix says (PNG without one) and write it through
    the one atomic writer: savefig on the path itself would write into a FIFO or a device."""
    import matplotlib.pyplot as plt

    image = io.BytesIO()
    figure.savefig(image, format=Path(path).suffix.lstrip(".") or "png", dpi=110)
    plt.close(figure)
    write_atomically(path, image.getvalue())
