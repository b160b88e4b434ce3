"""The tokenizer without transformers (pairs/lean_tokenizer.py, chat_template.py) against transformers'
own on the same files: the same ids through the chat template and raw, the same text decoded whole
and streamed as the live view streams it, on prompts of every kind; and files it cannot stand for
refused at load, with transformers' tokenizer and a notice instead."""

import json
import logging
import shutil
from pathlib import Path

import jinja2
import pytest
from conftest import char_tokenizer
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from specdec_cli.pairs import loading
from specdec_cli.pairs.lean_tokenizer import LeanTokenizer, NotLean
from specdec_cli.pairs.tokenization import Detokenizer, encode_conversation, encode_prompt

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "specdec_cli" / "trained" / "smollm2-135m-draft"  # the default target's tokenizer files, shipped

EDGES = [
    "Hi", "hello world", " leading space", "trailing space ", "  two  spaces  ", "\n", "tab\there", "line\nbreak\r\nwindows",
    "", " ", "é", "naïve café déjà vu", "Straße Ærø Øre", "日本語のテキスト", "中文，标点。", "한국어 문장", "مرحبا بالعالم",
    "emoji 🎉🚀👩‍👩‍👧‍👦 flags 🇫🇷", "combining e\u0301 and a\u0308", "zero\u200bwidth", "\u00a0non-breaking\u00a0", "\U0001f600",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "text<|im_end|>more", "<|im_start|>user\nHi<|im_end|>", "<|im_",
    "<|im_end|><|im_end|>", "< |im_end| >", "{{ messages }}", "{% if true %}x{% endif %}", "{# comment #}", "raise_exception('x')",
    "```python\ndef f(x):\n    return x ** 2\n```", "1234567890 3.14159 -0.5e-10", "a" * 300, "The quick brown fox. " * 40,
    "<s></s><unk>", "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
]


def prompts() -> list[str]:
    unseen = [json.loads(line)["prompt"] for line in (ROOT / "benchmarks" / "unseen-prompts.jsonl").open()]
    return EDGES + unseen


@pytest.fixture(scope="module")
def smollm2():
    return LeanTokenizer.from_directory(SMOLLM2), TokenizersBackend.from_pretrained(SMOLLM2)


@pytest.fixture(scope="module")
def chars(tmp_path_factory):
    directory = tmp_path_factory.mktemp("chars")
    char_tokenizer().save_pretrained(directory)
    return LeanTokenizer.from_directory(directory), TokenizersBackend.from_pretrained(directory)


def test_the_chat_template_and_raw_prompts_give_transformers_ids(smollm2):
    lean, theirs = smollm2
    assert lean.chat_template == theirs.chat_template and lean.chat_template
    for text in prompts():
        messages = [{"role": "user", "content": text}]
        assert (lean.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)), text
        assert encode_prompt(lean, text) == encode_prompt(theirs, text), text
        assert encode_prompt(lean, text, raw=True) == encode_prompt(theirs, text, raw=True), text
        assert lean(text, add_special_tokens=False) == {"input_ids": theirs(text, add_special_tokens=False)["input_ids"]}


def test_conversations_with_a_system_turn_and_without_the_generation_prompt(smollm2):
    lean, theirs = smollm2
    turns = [{"role": "system", "content": "Be brief. <|im_end|>"}, {"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "4"}, {"role": "user", "content": "日本?"}]
    for messages in (turns, turns[1:], turns[:1]):
        assert encode_conversation(lean, messages) == encode_conversation(theirs, messages)
        assert (lean.apply_chat_template(messages, add_generation_prompt=False)
                == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=False))


def test_decoding_whole_and_streamed_as_the_live_view_gives_transformers_text(smollm2):
    lean, theirs = smollm2
    special = [theirs.eos_token_id, theirs.bos_token_id, theirs.unk_token_id]
    for text in prompts():
        ids = encode_prompt(theirs, text) + special  # the template's special tokens, and some more
        for skip in (True, False):
            assert lean.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), text
        for step in (1, 3):  # the live view pushes each round's tokens: one, or a few at a time
            ours, reference = Detokenizer(lean), Detokenizer(theirs)
            for start in range(0, len(ids), step):
                chunk = ids[start : start + step]
                assert ours.peek(chunk) == reference.peek(chunk) and ours.push(chunk) == reference.push(chunk), text
            assert ours.text == reference.text


def test_split_bytes_stream_as_whole_characters(smollm2):
    """A byte-level token can be half a character: the live view holds it back in both."""
    lean, theirs = smollm2
    ids = lean("🎉 日本", add_special_tokens=False)["input_ids"]
    pieces = [Detokenizer(t) for t in (lean, theirs)]
    streamed = [[d.push([token]) for token in ids] for d in pieces]
    assert streamed[0] == streamed[1] and "" in streamed[0] and "".join(streamed[0]) == "🎉 日本"


def test_special_ids_vocabulary_and_a_tokenizer_without_a_template(smollm2, chars):
    for lean, theirs in (smollm2, chars):
        assert (lean.eos_token_id, lean.bos_token_id, lean.pad_token_id) == (theirs.eos_token_id, theirs.bos_token_id,
                                                                             theirs.pad_token_id)
        assert lean.get_vocab() == theirs.get_vocab()
        assert lean.special_tokens_map == theirs.special_tokens_map
    lean, theirs = chars
    assert lean.chat_template is None is theirs.chat_template
    for text in EDGES:
        printable = "".join(c for c in text if " " <= c <= "~")
        assert encode_prompt(lean, printable) == encode_prompt(theirs, printable)
        assert lean.decode(encode_prompt(lean, printable), skip_special_tokens=True) == theirs.decode(
            encode_prompt(theirs, printable), skip_special_tokens=True)


TEMPLATE = """{%- set ns = namespace(count=0) -%}
{%- for message in messages -%}
{%- if message['role'] == 'bad' %}{{ raise_exception('no bad roles') }}{% endif -%}
{%- set ns.count = ns.count + 1 -%}
{%- if loop.index > 3 %}{% break %}{% endif -%}
<{{ message['role'] }}>{% generation %} {{ message['content'] }} {% endgeneration %}</s>
  {{ dict(n=ns.count) | tojson }} {{ {'é': message['content'][:3] | trim} | tojson(indent=1) }}
    {% if loop.first %}first{% endif %}
{% endfor -%}
{{ bos_token ~ eos_token ~ pad_token ~ (tools is none) | string ~ (documents is none) | string }}
{%- if add_generation_prompt %}<assistant>{% endif %}"""


def test_the_template_environment_is_transformers(tmp_path):
    """Whitespace control, loop controls, the generation block, namespace, dict, tojson (not HTML-escaped,
    non-ASCII kept), raise_exception and the special tokens, rendered alike."""
    shutil.copytree(SMOLLM2, tmp_path / "tok", ignore=shutil.ignore_patterns("*.safetensors", "*.jsonl"))
    (tmp_path / "tok" / "chat_template.jinja").write_text(TEMPLATE)
    lean, theirs = LeanTokenizer.from_directory(tmp_path / "tok"), TokenizersBackend.from_pretrained(tmp_path / "tok")
    messages = [{"role": "user", "content": f" turn {i} <&> é "} for i in range(5)]
    for generation in (True, False):
        ours = lean.apply_chat_template(messages, add_generation_prompt=generation)
        assert ours == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    assert '"é"' in ours and "<&>" in ours and "&lt;" not in ours
    for tokenizer in (lean, theirs):
        with pytest.raises(jinja2.exceptions.TemplateError, match="no bad roles"):
            tokenizer.apply_chat_template([{"role": "bad", "content": "x"}], tokenize=False)
    escape = "{% set ns = namespace(_x=1) %}"  # an underscore attribute: refused by both sandboxes
    with pytest.raises(jinja2.exceptions.SecurityError):
        theirs.apply_chat_template(messages, tokenize=False, chat_template=escape)
    with pytest.raises(jinja2.exceptions.SecurityError):
        LeanTokenizer(lean.backend, lean.special_tokens_map, escape).apply_chat_template(messages)


def changed_copy(tmp_path, config_change: dict | None = None, added: dict | None = None, extra_file: str | None = None) -> Path:
    directory = tmp_path / "changed"
    shutil.copytree(SMOLLM2, directory, ignore=shutil.ignore_patterns("*.safetensors", "*.jsonl"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(config | (config_change or {})))
    if added is not None:
        backend = json.loads((directory / "tokenizer.json").read_text())
        backend["added_tokens"] = [t | added if t["content"] == "<|im_end|>" else t for t in backend["added_tokens"]]
        (directory / "tokenizer.json").write_text(json.dumps(backend))
    if extra_file:
        (directory / extra_file).write_text("{}")
    return directory


@pytest.mark.parametrize("change, reason", [
    (dict(config_change={"tokenizer_class": "GPT2Tokenizer"}), "tokenizer_class is 'GPT2Tokenizer'"),
    (dict(config_change={"added_tokens_decoder": {}}), "sets 'added_tokens_decoder'"),
    (dict(config_change={"additional_special_tokens": ["<|im_start|>"]}), "sets 'additional_special_tokens'"),
    (dict(config_change={"add_bos_token": True}), "sets 'add_bos_token'"),
    (dict(config_change={"fix_mistral_regex": True}), "sets 'fix_mistral_regex'"),
    (dict(config_change={"clean_up_tokenization_spaces": True}), "sets clean_up_tokenization_spaces"),
    (dict(config_change={"eos_token": "<|not_there|>"}), "eos_token '<|not_there|>' is not one of"),
    (dict(config_change={"eos_token": {"content": "<|im_end|>", "lstrip": True}}), "eos_token has properties"),
    (dict(added={"lstrip": True}), "eos_token '<|im_end|>' is not one of"),
    (dict(added={"special": False}), "eos_token '<|im_end|>' is not one of"),
    (dict(extra_file="special_tokens_map.json"), "it has special_tokens_map.json"),
])
def test_files_that_ask_transformers_for_more_are_refused_at_load(tmp_path, change, reason):
    with pytest.raises(NotLean, match=reason):
        LeanTokenizer.from_directory(changed_copy(tmp_path, **change))


def test_a_lean_target_whose_tokenizer_needs_transformers_loads_transformers_and_says_so(tmp_path, caplog):
    directory = changed_copy(tmp_path, config_change={"add_bos_token": True})
    with caplog.at_level(logging.INFO, logger="specdec"):
        tokenizer = loading.target_tokenizer(str(directory), lean=True, without_transformers=True)
        plain = loading.target_tokenizer(str(SMOLLM2), lean=False, without_transformers=True)
        loading.target_tokenizer(str(directory), lean=True, without_transformers=False)  # transformers' model: nothing to say
    assert isinstance(tokenizer, TokenizersBackend) and isinstance(plain, TokenizersBackend)
    told = [r.getMessage() for r in caplog.records]
    assert told == ["the tokenizer loads through transformers, about a second more at every start: "
                    "tokenizer_config.json sets 'add_bos_token'"]
    assert isinstance(loading.target_tokenizer(str(SMOLLM2), lean=True, without_transformers=True), LeanTokenizer)


def gemma_style(directory: Path) -> Path:
    """A small tokenizer as transformers' GemmaTokenizer saves one: byte fallback, spaces as "▁", and a
    tokenizer_config.json that names the class, which rebuilds the Tokenizer from the file's vocabulary."""
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4} | {f"<0x{b:02X}>": 5 + b for b in range(256)}
    for piece in ("▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "he", "ll", "▁he", "lo", "▁w", "or", "▁wor", "ld", "▁world"):
        vocab.setdefault(piece, len(vocab))
    merges = [("▁", "h"), ("h", "e"), ("l", "l"), ("▁", "he"), ("l", "o"), ("▁", "w"), ("o", "r"), ("▁w", "or"),
              ("l", "d"), ("▁wor", "ld")]
    GemmaTokenizer(vocab=vocab, merges=merges).save_pretrained(directory)
    return directory


def test_a_class_that_rebuilds_the_tokenizer_gives_transformers_ids_and_text_where_its_parts_are_the_files(tmp_path):
    directory = gemma_style(tmp_path / "gemma")
    lean, theirs = LeanTokenizer.from_directory(directory), loading.load_tokenizer(str(directory))
    assert type(theirs).__name__ == "GemmaTokenizer"
    assert lean.special_tokens_map == theirs.special_tokens_map and lean.get_vocab() == theirs.get_vocab()
    for text in EDGES:
        ids = encode_prompt(theirs, text, raw=True)
        assert encode_prompt(lean, text, raw=True) == ids, text
        for skip in (True, False):
            assert lean.decode(ids + [1, 2], skip_special_tokens=skip) == theirs.decode(ids + [1, 2], skip_special_tokens=skip)


@pytest.mark.parametrize("part, changed, reason", [
    ("decoder", {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                  {"type": "Fuse"}]}, "tokenizer.json's decoder is not the one"),
    ("normalizer", None, "tokenizer.json's normalizer is not the one"),
    ("byte_fallback", False, "tokenizer.json's model sets byte_fallback otherwise"),
])
def test_a_rebuilding_class_whose_parts_are_not_the_files_is_refused(tmp_path, part, changed, reason):
    """transformers builds the class's own parts, so tokenizer.json's would give other ids or text."""
    from tokenizers import Tokenizer

    directory = gemma_style(tmp_path / "gemma")
    backend = json.loads((directory / "tokenizer.json").read_text())
    (backend["model"] if part == "byte_fallback" else backend)[part] = changed
    (directory / "tokenizer.json").write_text(json.dumps(backend))
    with pytest.raises(NotLean, match=f"{reason}.* its GemmaTokenizer"):
        LeanTokenizer.from_directory(directory)
    theirs, files = loading.load_tokenizer(str(directory)), Tokenizer.from_file(str(directory / "tokenizer.json"))
    text = "Hello é"  # an upper-case letter and an accent: not in the vocabulary, so byte fallback
    ids = theirs(text, add_special_tokens=False)["input_ids"]
    assert (files.encode(text, add_special_tokens=False).ids, files.decode(ids)) != (ids, theirs.decode(ids))
