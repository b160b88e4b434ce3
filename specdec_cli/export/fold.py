"""One K for an engine that cannot take a K per request: the per-scenario measurements folded by a
traffic mix, as small pure functions.

An engine runs one K for every request, so the scenarios' Ks have to become one. The right one is
not an average of the Ks: it is the K that makes the whole mix fastest. With ``w_s`` the share of
output tokens from scenario s, a token of the mix costs on average Σ w_s · cost_s(K) / E_s(K) plain
forwards (cost per round over tokens per round, decoding/control/speedup.py's model with each scenario's
α, c and verify costs from the profile), so the mix's speed-up is the inverse of that sum and K
maximises it. K = 0 (plain decoding) costs exactly 1 per token, so the fold says "off" when no K
beats plain.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..decoding.control.speedup import expected_tokens, fill_verify_costs
from ..errors import UserError
from ..pairs.profile import PairProfile, ScenarioProfile


def parse_traffic(text: str) -> dict[str, float]:
    """``code=0.6,chat=0.4`` → shares that sum to 1 (given weights are normalised, so 3,1 works too)."""
    shares: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            weight = float(value) if sep else float("nan")
        except ValueError:
            weight = float("nan")
        if not name or not weight >= 0 or weight == float("inf"):
            raise UserError(f"--traffic takes SCENARIO=SHARE,... with shares of at least 0 (like code=0.6,chat=0.4), got {item!r}")
        if name in shares:
            raise UserError(f"--traffic names scenario {name!r} twice")
        shares[name] = weight
    top = max(shares.values())
    if top <= 0:
        raise UserError("--traffic: the shares add up to 0")
    scaled = {name: weight / top for name, weight in shares.items()}  # first: shares near a float's top sum to inf
    total = sum(scaled.values())
    return {name: weight / total for name, weight in scaled.items()}


def round_cost(section: ScenarioProfile, k: int, verify: dict[int, float]) -> float:
    """One round's cost in one-token target forwards: verify the K + 1 tokens, draft K."""
    return 1.0 if k <= 0 else verify[k] + k * section.c


def speedup_at(section: ScenarioProfile, k: int, verify: dict[int, float]) -> float:
    """Predicted speed-up over plain decoding of one scenario at K (1 at K = 0)."""
    return expected_tokens(section.alpha, k) / round_cost(section, k, verify)


def candidate_ks(sections: list[ScenarioProfile]) -> list[int]:
    """0 and every K that some scenario measured a verify cost for (the fold never extrapolates far)."""
    measured = {k for section in sections for k in section.verify_cost if k > 0}
    return [0, *range(1, max(measured, default=0) + 1)]


@dataclass(frozen=True)
class Fold:
    """The one K for a traffic mix and what it predicts, next to each scenario's own best."""

    k: int
    speedup: float  # predicted for the mix at k
    shares: dict[str, float]
    own_k: dict[str, int]  # each scenario's K in the profile
    by_k: dict[int, float]  # the mix's predicted speed-up at every candidate K

    def describe(self) -> str:
        mix = ", ".join(f"{name} {share:.0%} (K={self.own_k[name]})" for name, share in self.shares.items())
        chosen = f"K={self.k}" if self.k else "K=0 (speculation off: no K beats plain on this mix)"
        return f"folded {mix} into {chosen}, predicted {self.speedup:.2f}x plain for the mix"


def fold(profile: PairProfile, shares: dict[str, float]) -> Fold:
    """The K that maximises the mix's predicted tokens per second (ties go to the smaller K)."""
    unknown = [name for name in shares if name not in profile.scenarios]
    if unknown:
        raise UserError(f"--traffic names scenario {unknown[0]!r}, which profile of {profile.pair!r} does not have "
                        f"(it has {', '.join(profile.scenarios) or 'none'})")
    sections = {name: profile.scenarios[name] for name, share in shares.items() if share > 0}
    ks = candidate_ks(list(sections.values()))
    verify = {name: fill_verify_costs(section.verify_cost, ks) for name, section in sections.items()}
    by_k = {}
    for k in ks:
        per_token = sum(shares[name] * round_cost(s, k, verify[name]) / expected_tokens(s.alpha, k)
                        for name, s in sections.items())
        by_k[k] = 1.0 / per_token
    best = max(ks, key=lambda k: (round(by_k[k], 9), -k))
    return Fold(best, by_k[best], dict(shares), {name: profile.scenarios[name].k for name in shares}, by_k)


def sensitivity(section: ScenarioProfile, k: int) -> dict[int, float]:
    """Predicted speed-up at K − 1, K and K + 1 (those with costs): how much the choice of K matters."""
    ks = candidate_ks([section])
    verify = fill_verify_costs(section.verify_cost, ks)
    return {j: speedup_at(section, j, verify) for j in (k - 1, k, k + 1) if j in ks}
