"""The drafters without weights, one line each: the name models.yaml (`draft:`, `free:`), `--drafter`
and `specdec bench`'s mode use, how `specdec models`, `--drafter --help` and `bench --modes --help`
describe it, its own keys in a models.yaml mapping, its class by its full dotted path
(decoding/loaded_pair.py imports it when a pair uses it, and builds it with the class's ``for_pair``),
and the serving engines' method of the same family, where one has it. A new free drafter is its
module (specdec's own in ``decoding/drafters/``) plus one line in FREE_KINDS; everything else reads FREE_KINDS
when it is asked, never a copy made at import.

Nothing here imports torch: the registry reads this table to parse models.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FreeKind:
    name: str
    what: str  # what it drafts from, in a few words (`specdec models`, `--drafter --help`)
    drafter: str  # "package.module:Class"; Class.for_pair(spec, vocab_size) builds it (drafters/base.Drafter)
    keys: tuple[str, ...] = ()  # its own models.yaml keys besides `kind` and `free`
    beside: bool = True  # may be listed under `free:` (prompt lookup stands beside a model or head as `lookup: true`)
    # drafts from a file (`source`), so a pair has one only where it names it (`drafters: {store: FILE}`)
    needs_source: bool = False
    engines: dict[str, str] = field(default_factory=dict)  # engine → its speculative method of the same family

    @property
    def text(self) -> str:
        return f"{self.name} ({self.what})"


FREE_KINDS = {kind.name: kind for kind in (
    FreeKind("ngram", "prompt lookup", "specdec_cli.decoding.drafters.lookup:NgramDrafter", ("max_ngram", "min_ngram"),
             beside=False, engines={"vllm": "ngram", "sglang": "NGRAM", "llama.cpp": "ngram-mod",
                                    "transformers": "prompt_lookup_num_tokens"}),
    FreeKind("recycle", "token recycling: the target's own earlier predictions",
             "specdec_cli.decoding.drafters.recycle:RecycleDrafter"),
    # vLLM's `suffix` method is this family, but needs arctic-inference, which specdec does not install
    FreeKind("suffix", "memory of earlier answers", "specdec_cli.decoding.drafters.suffix:SuffixDrafter"),
    FreeKind("store", "the target's own stored answers", "specdec_cli.decoding.drafters.store:StoreDrafter",
             ("source",), needs_source=True),
)}


def beside_kinds() -> tuple[str, ...]:
    """The kinds models.yaml's `free:` may list."""
    return tuple(name for name, kind in FREE_KINDS.items() if kind.beside)


def described() -> str:
    """Every free kind as help text lists them: 'ngram' (prompt lookup), ..."""
    source = ": the file the pair names under drafters:"
    return ", ".join(f"'{kind.name}' ({kind.what}{source if kind.needs_source else ''})"
                     for kind in FREE_KINDS.values())
