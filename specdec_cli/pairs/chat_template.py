"""A model's chat template rendered as transformers' ``apply_chat_template`` renders it, without
importing transformers (pairs/lean_tokenizer.py).

The environment is transformers' (utils/chat_template_utils.py, transformers 5): jinja2's immutable
sandbox with ``trim_blocks`` and ``lstrip_blocks``, the loop controls, a ``{% generation %}`` block
that renders its body, ``tojson`` without HTML escaping, and the globals ``raise_exception``,
``strftime_now``, ``dict`` and ``namespace`` (the sandbox's own narrow versions). The template sees
the messages, ``add_generation_prompt``, ``tools`` and ``documents`` (None) and the named special
tokens. Messages are specdec's own (a role and a content, strings: tokenization.py), so transformers'
normalisation of message objects, media and reasoning fields has nothing to do here; anything else
is refused rather than half done. tests/test_lean_tokenizer.py holds both renderings equal.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

LEAST_JINJA = (3, 1, 6)  # what transformers asks for: older releases have known sandbox escapes


class GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's tokens with it
    (for a mask specdec never asks for); rendered, it is its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


class TemplateDict:
    """``dict(...)`` in a template, without the type's other attributes."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)``, refusing underscore names (a way towards CPython's internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute.")


def jinja_new_enough(version: str = jinja2.__version__) -> bool:
    """Whether ``version`` ("3.1.6") is at least LEAST_JINJA; a pre-release or odd form is not taken
    for one (transformers, which decides then, may refuse it)."""
    parts = version.split(".")
    return all(part.isdigit() for part in parts) and tuple(int(p) for p in parts) >= LEAST_JINJA


@lru_cache
def compiled(template: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(),
                               namespace=TemplateNamespace)
    return environment.from_string(template)


def render(template: str, messages: list[dict], add_generation_prompt: bool, special_tokens: dict[str, str]) -> str:
    """The conversation as the template writes it; ``special_tokens``: bos_token, eos_token, ... by name."""
    for message in messages:
        if not set(message) <= {"role", "content"} or not all(type(value) is str for value in message.values()):
            raise TypeError(f"a message of a role and a content is rendered here, not {message!r}")
    return compiled(template).render(messages=[dict(m) for m in messages], tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt, **special_tokens)
