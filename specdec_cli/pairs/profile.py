"""Calibration profiles: what `calibrate-k` measured, per pair and scenario, kept in a YAML file.

Measured timings belong to one machine and change whenever it is recalibrated, so they live apart
from the hand-written ``models.yaml``. Where the file is: ``--profile``/``--write PATH``, else the
pair's ``profile:`` key (relative to its models.yaml), else ``$SPECDEC_PROFILE``, else
``$XDG_CONFIG_HOME/specdec/profile.yaml`` (``~/.config/specdec/profile.yaml``). Writing replaces
only one pair's section (one per pair and target dtype: ``NAME`` at float32, ``NAME@int4`` etc.,
since a compressed target changes verify costs and acceptance; round-trip YAML keeps comments and the other pairs) and goes through a
temporary file and a rename, so an interrupted write never leaves a damaged profile, under a lock, so
two calibrations writing one file at once both keep their sections (atomic.updating).
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from ..atomic import updating, write_atomically
from ..errors import UserError
from . import fields
from .registry import NGRAM, PairSpec
from .yaml_input import load

HEADER = (
    "specdec calibration profiles, written by `specdec calibrate-k --write` (one section per pair and target dtype).\n"
    "Measured on this machine; recalibrate after changing hardware, models or libraries.\n"
)
VERDICTS = ("speculate", "off")


def default_path() -> Path:
    if os.environ.get("SPECDEC_PROFILE"):
        return Path(os.environ["SPECDEC_PROFILE"]).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config) / "specdec" / "profile.yaml"


def profile_path(explicit: str | Path | None, pair: PairSpec) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    return pair.profile or default_path()


def open_profile(explicit: str | Path | None, pair: PairSpec, warn=lambda message: None) -> "ProfileWatcher":
    """The pair's profile, read and watched; a profile named on the command line must exist, since
    silently running without it would measure something other than what was asked for."""
    path = profile_path(explicit, pair)
    if explicit and path.is_dir():
        raise UserError(f"profile file {path} is a directory; name the profile (a YAML file) itself")
    if explicit and not path.is_file():
        raise UserError(f"profile file not found: {path}")
    return ProfileWatcher(path, pair, warn)


@dataclass(frozen=True)
class ScenarioProfile:
    k: int  # the K to start from: best_k when speculation pays, else 0
    verdict: str
    best_k: int
    speedup: float  # measured at best_k, over plain decoding
    alpha: float  # per-token acceptance
    c: float  # draft cost per drafted token, in one-token target forwards
    verify_cost: dict[int, float] = field(default_factory=dict)  # K → (K+1)-token forward / 1-token forward


@dataclass(frozen=True)
class PairProfile:
    pair: str
    calibrated: str  # ISO date and time
    target: str
    draft: str
    scenarios: dict[str, ScenarioProfile]
    overall: ScenarioProfile | None = None
    versions: dict[str, str] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)
    drafter: dict[str, object] = field(default_factory=dict)  # drafter_identity() of the drafter measured
    dtype: str = "float32"  # the target's precision: verify costs and acceptance change with it
    computed_by: dict[str, object] = field(default_factory=dict)  # the target's kernels (runtime/computed_by.py)

    def for_scenario(self, scenario: str | None) -> ScenarioProfile | None:
        """The scenario's section; prompts without one use `default`, unknown scenarios `overall`."""
        return self.scenarios.get(scenario or "default") or self.overall

    def matches(self, pair: PairSpec) -> bool:
        """True when calibrated with the target and the very drafter the pair now runs."""
        return self.mismatch(pair) is None

    def mismatch(self, pair: PairSpec, computed_by: dict | None = None) -> str | None:
        """Why this profile does not fit the pair (one clause), or None when it does; ``computed_by``:
        the loaded target's kernels, which must be those the profile was measured on."""
        if self.target != str(pair.target.source):
            return (f"calibrated with other models: target {fields.shown(self.target)} then, "
                    f"{fields.shown(str(pair.target.source))} now")
        if self.dtype != pair.target.dtype:
            return f"calibrated with the target at another precision: {self.dtype} then, {pair.target.dtype} now"
        mine = drafter_identity(pair)
        if not self.drafter:
            return "it names no drafter (written by an older specdec); recalibrate with `specdec calibrate-k --write`"
        if not same_drafter(self.drafter, mine):
            return (f"calibrated with another drafter: {fields.shown(describe_drafter(self.drafter))} then, "
                    f"{fields.shown(describe_drafter(mine))} now")
        other = kernels_mismatch(self.computed_by, computed_by or {})
        if other:
            return f"{other}; recalibrate with `specdec calibrate-k --write`"
        return None


KERNEL_KEYS = ("kernels", "prefill")  # what must agree for a profile's acceptance and timings to hold


def kernels_mismatch(recorded: dict, now: dict) -> str | None:
    """Why figures measured under ``recorded`` kernels do not hold under ``now``'s (one clause), or
    None. The outputs themselves differ between specdec's kernels and torch's (docs/precision.md), so
    acceptance and verify costs do too. A record without these keys (an older profile) or a run not
    yet loaded (``now`` empty) is not compared."""
    for key in KERNEL_KEYS:
        if key in recorded and key in now and recorded[key] != now[key]:
            return f"measured with {key} {recorded[key]}, this run has {now[key]}"
    return None


def k_values(text: str) -> list[int]:
    """'0..8', '0,2,4' or '5' → the sorted K values: calibrate-k's --k, as the profile keeps it.
    ValueError, in words a command can put after its option's name, when it is not one."""
    ks: set[int] = set()
    for part in str(text).split(","):
        low, dots, high = part.strip().partition("..")
        try:
            values = range(int(low), int(high) + 1) if dots else [int(low)]
        except ValueError:
            raise ValueError(f"takes a range like 0..8 or a list like 0,2,4; got {text!r}") from None
        if not values:
            raise ValueError(f"range {part.strip()!r} is empty")
        ks.update(values)
    return sorted(ks)


def section_name(pair: PairSpec) -> str:
    """The pair's section in the profile file: one per target dtype (float32 keeps the bare name)."""
    return pair.name if pair.target.dtype == "float32" else f"{pair.name}@{pair.target.dtype}"


def drafter_name(pair: PairSpec) -> str:
    """The drafter in a few words, for the profile's human-readable ``draft:`` line."""
    return describe_drafter(drafter_identity(pair))


def drafter_identity(pair: PairSpec) -> dict[str, object]:
    """The pair's running drafter exactly: kind, source, whether prompt lookup goes first, and for a
    head the hash of its weights (its path differs between checkouts; its weights do not)."""
    spec = pair.drafter
    identity: dict[str, object] = {"kind": spec.kind, "lookup": spec.lookup}
    if spec.head is not None:
        identity["source"] = str(spec.head)
        identity["sha256"] = head_hash(spec.head)
    elif spec.model is not None:
        identity["source"] = str(spec.model.source)
    elif spec.answers is not None:  # a store: its answers, by their hash as a head's weights
        identity["source"] = str(spec.answers)
        identity["sha256"] = file_hash(spec.answers)
    elif spec.kind == NGRAM:
        identity["source"] = f"ngram {spec.min_ngram}-{spec.max_ngram}"
    else:
        identity["source"] = spec.kind
    return identity


def file_hash(path: Path) -> str:
    """The first 16 hex digits of a file's sha256 ('missing' when there is none)."""
    path = Path(path)
    if not path.is_file():
        return "missing"
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def head_hash(directory: Path) -> str:
    """The hash of a head's weights (its path differs between checkouts; its weights do not)."""
    return file_hash(Path(directory) / "head.safetensors")


def same_drafter(a: dict, b: dict) -> bool:
    """Same kind and lookup; a drafter with a hash (a head's weights, a store's answers) by it, anything
    else by its source."""
    if a.get("kind") != b.get("kind") or bool(a.get("lookup")) != bool(b.get("lookup")):
        return False
    key = "sha256" if "sha256" in a else "source"
    return str(a.get(key)) == str(b.get(key))


def describe_drafter(identity: dict) -> str:
    kind = identity.get("kind", "?")
    text = str(identity.get("source"))
    if "sha256" in identity:
        text = f"{kind} {text} (sha256 {identity['sha256']})"
    return f"{text} after prompt lookup" if identity.get("lookup") else text


# --- reading -------------------------------------------------------------------------------------


def read_profiles(path: Path) -> dict[str, PairProfile]:
    """Every pair's profile in the file; {} when there is no file. A malformed file is a UserError."""
    if not path.is_file():
        return {}
    data = _load(path)
    pairs = data.get("pairs") if isinstance(data, dict) else None
    if data is None:
        return {}
    if not isinstance(pairs, dict):
        raise UserError(f"{path}: not a specdec profile (expected a mapping with a 'pairs' section)")
    return {str(name): _pair(path, str(name), body) for name, body in pairs.items()}


def _load(path: Path):
    return load(path, typ="rt")


def _pair(path: Path, name: str, body) -> PairProfile:
    where = f"{path}: profile of pair {fields.shown(name)}"
    if not isinstance(body, dict) or not isinstance(body.get("scenarios"), dict):
        raise UserError(f"{where} needs a 'scenarios' mapping")
    scenarios = {str(s): _scenario(f"{where} scenario {fields.shown(s)}", v) for s, v in body["scenarios"].items()}
    overall = _scenario(f"{where} overall", body["overall"]) if body.get("overall") is not None else None
    return PairProfile(
        pair=name,
        calibrated=str(body.get("calibrated", "")),  # YAML may read an unquoted date as a timestamp
        target=fields.string(body, "target", where),
        draft=fields.string(body, "draft", where),
        dtype=fields.string(body, "dtype", where, "float32"),
        scenarios=scenarios,
        overall=overall,
        versions={str(k): str(v) for k, v in fields.mapping(body, "versions", where).items()},
        settings={str(k): _plain(v) for k, v in fields.mapping(body, "settings", where).items()},
        drafter=_plain(fields.mapping(body, "drafter", where)),
        computed_by=_plain(fields.mapping(body, "computed_by", where)),
    )


def _scenario(where: str, body) -> ScenarioProfile:
    """Every field of its type and range, or one line naming it: a K is never truncated or taken from a string."""
    if not isinstance(body, dict):
        raise UserError(f"{where}: expected a mapping with k, alpha, c, verify_cost")
    k = fields.k_field(body, "k", where)
    return ScenarioProfile(
        k=k,
        verdict=fields.choice(body, "verdict", where, VERDICTS, "speculate" if k else "off"),
        best_k=fields.k_field(body, "best_k", where, k),
        speedup=fields.number(body, "speedup", where, 1.0),
        alpha=fields.number(body, "alpha", where, high=1.0),
        c=fields.number(body, "c", where, 0.0),
        verify_cost=fields.costs(body, where),
    )


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# --- writing -------------------------------------------------------------------------------------


def write_profile(path: Path, profile: PairProfile) -> None:
    """Put ``profile`` into the file at ``path``, replacing only that pair's section, under the
    file's lock: two calibrations writing one profile at once both keep their sections.

    Refuses (UserError) to touch a file it cannot parse rather than overwrite it.
    """
    yaml = YAML(typ="rt")
    yaml.default_flow_style = False
    yaml.width = 4096  # keep each verify_cost mapping on one line
    with updating(path) as target:
        data = _load(target) if target.is_file() else None
        if data is None:
            data = CommentedMap()
            data.yaml_set_start_comment(HEADER)
        if isinstance(data, dict) and data.get("pairs") is None:
            data["pairs"] = CommentedMap()
        if not isinstance(data, dict) or not isinstance(data["pairs"], dict):
            raise UserError(f"{path}: not a specdec profile; refusing to overwrite it")
        data["pairs"][profile.pair] = _section(profile)
        text = io.StringIO()
        yaml.dump(data, text)
        write_atomically(target, text.getvalue())


def _section(profile: PairProfile) -> CommentedMap:
    body = CommentedMap(calibrated=profile.calibrated, target=profile.target, dtype=profile.dtype, draft=profile.draft)
    body["drafter"] = CommentedMap(profile.drafter)
    body["versions"] = CommentedMap(profile.versions)
    body["settings"] = CommentedMap(profile.settings)
    if profile.computed_by:
        body["computed_by"] = CommentedMap(profile.computed_by)
    body["scenarios"] = CommentedMap((name, _scenario_map(s)) for name, s in profile.scenarios.items())
    if profile.overall is not None:
        body["overall"] = _scenario_map(profile.overall)
    return body


def _scenario_map(section: ScenarioProfile) -> CommentedMap:
    body = CommentedMap(k=section.k, verdict=section.verdict, best_k=section.best_k, speedup=section.speedup,
                        alpha=section.alpha, c=section.c)
    costs = CommentedMap(section.verify_cost)
    costs.fa.set_flow_style()
    body["verify_cost"] = costs
    return body


# --- hot reload ----------------------------------------------------------------------------------


class ProfileWatcher:
    """One pair's profile, re-read when the file changes (checked before each prompt).

    A rewrite goes through a rename, so (inode, mtime, size) changes even within one clock tick.
    A profile that turns unreadable while running keeps the last good one and says so once.
    """

    def __init__(self, path: Path, pair: PairSpec, warn=lambda message: None):
        self.path, self.pair, self.warn = path, pair, warn
        self.stamp: tuple | None = None
        self.profile: PairProfile | None = None
        self.computed_by: dict = {}  # the loaded target's kernels, once ``expect`` says
        self.changed()

    def expect(self, computed_by: dict) -> None:
        """The loaded target's kernels (known only once the pair is loaded, after the profile was
        read): the profile in use, and any reloaded later, must have been measured on them."""
        self.computed_by = computed_by
        why = self.profile.mismatch(self.pair, computed_by) if self.profile is not None else None
        if why:
            self.warn(f"{self.path}: ignoring the profile of {self.pair.name!r}: {why}")
            self.profile = None

    def changed(self) -> bool:
        """Reload if the file changed; True when the profile in use is now a different one."""
        stamp = self._stamp()
        if stamp == self.stamp:
            return False
        first, self.stamp = self.stamp is None, stamp
        try:
            profile = read_profiles(self.path).get(section_name(self.pair)) if stamp else None
        except UserError as exc:
            if first:
                raise
            self.warn(f"{exc}; keeping the profile read before")
            return False
        why = profile.mismatch(self.pair, self.computed_by) if profile is not None else None
        if why:
            self.warn(f"{self.path}: ignoring the profile of {self.pair.name!r}: {why}")
            profile = None
        before, self.profile = self.profile, profile
        return profile != before

    def seeded(self) -> str:
        """Which profile seeds adaptive K, in one line for stderr."""
        if self.profile is None:
            return (f"auto starts from the pair's K and its drafter's recorded acceptance, if any (no usable profile "
                    f"of {self.pair.name!r} in {self.path})")
        return (f"auto starts from profile {self.path} (pair {self.pair.name!r}, calibrated {self.profile.calibrated}, "
                f"drafter {describe_drafter(self.profile.drafter)})")

    def _stamp(self) -> tuple | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns, stat.st_size
