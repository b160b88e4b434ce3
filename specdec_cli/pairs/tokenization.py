"""Tokenizer concerns: the shared-vocabulary check, prompt encoding, and incremental detokenization."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def check_compatible(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> None:
    """The draft's ids must mean what the target's ids mean, or its proposals are noise.

    Only the tokenizers are compared: embedding matrices padded to different sizes are fine.
    """
    target_vocab, draft_vocab = target.get_vocab(), draft.get_vocab()
    for token, token_id in sorted(target_vocab.items(), key=lambda item: item[1]):
        other = draft_vocab.get(token)
        if other != token_id:
            where = "is missing from the draft" if other is None else f"is id {other} in the draft"
            raise UserError(f"incompatible tokenizers: token {token!r} is id {token_id} in the target but {where}")
    extra = sorted(set(draft_vocab) - set(target_vocab), key=draft_vocab.get)
    if extra:
        raise UserError(
            f"incompatible tokenizers: token {extra[0]!r} (id {draft_vocab[extra[0]]}) is in the draft but not the target"
        )


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, raw: bool = False) -> list[int]:
    """The chat template wraps the prompt as a user turn when the model has one, unless ``raw``."""
    if not raw and tokenizer.chat_template:
        return encode_conversation(tokenizer, [{"role": "user", "content": text}])
    return tokenizer(text)["input_ids"]


def encode_conversation(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> list[int]:
    """Several turns (``{"role", "content"}``, the last the user's) through the chat template, ready
    for the assistant's next reply."""
    if not tokenizer.chat_template:
        raise UserError("a conversation needs a model with a chat template")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def eos_ids(tokenizer: PreTrainedTokenizerBase, generation_config) -> set[int]:
    ids = getattr(generation_config, "eos_token_id", None)
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class Detokenizer:
    """Turns appended token ids into appended text.

    Tokens are decoded in context (a lone byte-level token can be half a UTF-8 character), and
    text is released only once it no longer ends in a replacement character.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def peek(self, ids: list[int]) -> str:
        """The text ``ids`` would add, without adding them."""
        full = self.tokenizer.decode(self.ids + ids, skip_special_tokens=True)
        return full[len(self.text) :] if full.startswith(self.text) else full

    def push(self, ids: list[int]) -> str:
        piece = self.peek(ids)
        self.ids += ids
        if piece.endswith("\ufffd"):
            return ""
        self.text += piece
        return piece
