"""The target's tokenizer from the `tokenizers` library alone, for a command that only decodes.

Importing transformers costs about a second of every start (its package scans every model's files),
and a target loaded for the lean forward needs nothing else of it (runtime/lean_model.py). Its
tokenizer, transformers' TokenizersBackend, is a ``tokenizers.Tokenizer`` read from tokenizer.json
with transformers' work on top: special tokens added or changed from tokenizer_config.json, a
post-processor rebuilt for add_bos_token / add_eos_token, truncation and padding, a regex patch
for Mistral's pre-tokenizer (only where tokenizer_config.json sets fix_mistral_regex), spaces
cleaned after decoding, several chat templates. Where the files ask for none of that — the form
transformers 5 writes, as for a converted GGUF — the Tokenizer alone gives the same ids and text,
and the chat template renders the same (chat_template.py); held equal by tests/test_lean_tokenizer.py.
Otherwise ``NotLean`` says why, when the tokenizer is loaded, and the command loads transformers'
(pairs/loading.py): one tokenizer a run, chosen at load.

Some classes (``REBUILT``: Gemma's) build their Tokenizer from tokenizer.json's vocabulary and merges
with parts of their own. Where tokenizer.json's parts are those, transformers ends with the file's
Tokenizer too, after parsing it in Python: seconds for a 262,144-token vocabulary, which the
`tokenizers` library reads in one.
"""

from __future__ import annotations

import json
from pathlib import Path

from .fields import shown

SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# tokenizer_config.json keys that change nothing a decode-only command does with the tokenizer
# (bounds, sides and input names of padding and truncation, which it never asks for), or checked below.
PLAIN_KEYS = {"tokenizer_class", "backend", *SPECIAL, "chat_template", "clean_up_tokenization_spaces",
              "split_special_tokens", "model_max_length", "padding_side", "truncation_side", "model_input_names",
              "is_local", "local_files_only"}
LEGACY_FILES = ("added_tokens.json", "special_tokens_map.json", "additional_chat_templates")
BPE_FLAGS = ("fuse_unk", "byte_fallback", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
             "ignore_merges")


class NotLean(ValueError):
    """These tokenizer files need transformers' tokenizer; the message says why."""


def gemma_parts(unk_token: str):
    """What transformers 5's GemmaTokenizer builds whatever tokenizer.json says (its ``__init__``), on
    an empty vocabulary."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    built = Tokenizer(BPE(vocab={unk_token: 0}, merges=[], fuse_unk=True, unk_token=unk_token, dropout=None,
                          byte_fallback=True))
    built.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    built.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    built.normalizer = normalizers.Replace(" ", "▁")
    return built


# A class that rebuilds the Tokenizer: its special tokens where tokenizer_config.json names none, its parts.
REBUILT = {"GemmaTokenizer": ({"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                               "mask_token": "<mask>"}, gemma_parts)}


def config_refusal(config: dict, files: set[str]) -> str | None:
    """Why transformers would make more of tokenizer_config.json (and the files beside it) than the
    Tokenizer in tokenizer.json, or None."""
    if config.get("tokenizer_class") not in ("TokenizersBackend", *REBUILT):
        return (f"its tokenizer_class is {shown(config.get('tokenizer_class'))}, not TokenizersBackend "
                f"or one that rebuilds to it ({', '.join(REBUILT)})")
    extra = sorted(set(config) - PLAIN_KEYS)
    if extra:
        return f"tokenizer_config.json sets {shown(extra[0])}"
    if config.get("backend", "tokenizers") != "tokenizers":
        return f"its backend is {shown(config['backend'])}"
    for key in ("clean_up_tokenization_spaces", "split_special_tokens"):
        if config.get(key):
            return f"tokenizer_config.json sets {key}"
    if not isinstance(config.get("chat_template", ""), str):
        return "it has several chat templates"
    for name in SPECIAL:
        if config.get(name) is not None and not isinstance(config[name], str):
            return f"its {name} has properties of its own"
    legacy = sorted(set(LEGACY_FILES) & files)
    return f"it has {legacy[0]}" if legacy else None


def backend_refusal(backend, special: dict[str, str]) -> str | None:
    """Why transformers would change the Tokenizer ``backend`` itself, or None: each named special
    token already added as transformers adds one (special, not normalised, no stripping), no
    truncation or padding, a post-processor of its own."""
    added = {token.content: token for token in backend.get_added_tokens_decoder().values()}
    for name, content in special.items():
        token = added.get(content)
        if token is None or not token.special or token.normalized or token.lstrip or token.rstrip or token.single_word:
            return f"its {name} {shown(content)} is not one of tokenizer.json's special tokens as transformers adds them"
    if backend.truncation is not None or backend.padding is not None:
        return "tokenizer.json truncates or pads"
    if backend.post_processor is None:
        return "tokenizer.json has no post-processor (transformers makes one)"
    return None


def rebuilt_refusal(backend, built, name: str) -> str | None:
    """Why class ``name``, rebuilding ``backend`` with its own parts (``built``), would end with another
    Tokenizer, or None."""
    ours, theirs = type(backend.model).__name__, type(built.model).__name__
    if ours != theirs:
        return f"its {name} builds a {theirs} model, and tokenizer.json holds a {ours}"
    for part in ("normalizer", "pre_tokenizer", "decoder"):
        if _state(getattr(backend, part)) != _state(getattr(built, part)):
            return f"tokenizer.json's {part} is not the one its {name} builds"
    for flag in BPE_FLAGS:
        if getattr(backend.model, flag) != getattr(built.model, flag):
            return f"tokenizer.json's model sets {flag} otherwise than its {name}"
    return None


def _state(part) -> bytes | None:
    return None if part is None else part.__getstate__()  # the part as JSON, as `tokenizers` pickles it


def chat_template(directory: Path, config: dict) -> str | None:
    """chat_template.jinja, else tokenizer_config.json's, as transformers reads them."""
    try:
        return (directory / "chat_template.jinja").read_text(encoding="utf-8")
    except FileNotFoundError:
        return config.get("chat_template")


class LeanTokenizer:
    """What specdec asks of a tokenizer on the decoding path, answered as transformers' TokenizersBackend
    answers it: ``tokenizer(text)["input_ids"]``, ``apply_chat_template(..., tokenize=False)``,
    ``decode``, the special tokens' ids and the vocabulary."""

    def __init__(self, backend, special: dict[str, str], template: str | None):
        self.backend, self.special_tokens_map, self.chat_template = backend, special, template

    @classmethod
    def from_directory(cls, directory: str | Path) -> "LeanTokenizer":
        """``NotLean`` where transformers would make more of the files than their Tokenizer."""
        root = Path(directory)
        try:
            config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise NotLean("it has no readable tokenizer_config.json") from None
        if not (root / "tokenizer.json").is_file():
            raise NotLean("it has no tokenizer.json")
        reason = config_refusal(config, {p.name for p in root.iterdir()})
        if reason:
            raise NotLean(reason)
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(root / "tokenizer.json"))
        name = config["tokenizer_class"]
        defaults, parts = REBUILT.get(name, ({}, None))
        named = defaults | {key: config[key] for key in SPECIAL if key in config}
        special = {key: value for key, value in named.items() if value is not None}
        reason = backend_refusal(backend, special)
        if reason is None and parts is not None:
            reason = rebuilt_refusal(backend, parts(str(named.get("unk_token"))), name)
        if reason:
            raise NotLean(reason)
        backend.encode_special_tokens = False  # transformers' split_special_tokens, False
        template = chat_template(root, config)
        if template is not None:
            from .chat_template import jinja_new_enough

            if not jinja_new_enough():
                raise NotLean("its chat template needs jinja2>=3.1.6")
        return cls(backend, special, template)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.backend.encode(text, add_special_tokens=add_special_tokens).ids}

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        """The conversation as text (``tokenize=False``: specdec tokenizes it itself, tokenization.py)."""
        if tokenize or self.chat_template is None:
            raise ValueError("the lean tokenizer renders a chat template as text only, and needs one")
        from .chat_template import render

        return render(self.chat_template, messages, add_generation_prompt, self.special_tokens_map)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_id(self, name: str) -> int | None:
        return self.backend.token_to_id(self.special_tokens_map[name]) if name in self.special_tokens_map else None

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self.token_id("bos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self.token_id("pad_token")

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)
