"""specdec's two YAML files (models.yaml, calibration profiles) read within bounds.

YAML's aliases make a small file stand for a huge document: nine anchors of nine references each
(the "billion laughs") are 656 bytes that write out as 387 million nodes, and anything that walks
or prints the value (a message's repr, a copy into plain dicts) takes gigabytes. The parser's
composer also recurses once per nesting level, so 200,000 ``[`` end in a RecursionError. ``load``
first composes the file (an alias is a shared node there, so composing is cheap), measures the
document as it would be written out, and refuses a file whose aliases add more than
MAX_ALIAS_GROWTH, one that refers to itself, or one nested too deeply; only then is it constructed.
Sharing settings with anchors stays possible: a device map shared by a few dozen pairs adds a few
thousand.
"""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML, YAMLError
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

from ..errors import UserError

# Both files are small: the packaged models.yaml is under 6 kB, a profile section about 1 kB per
# pair and dtype. A thousand times that still reads at once; a runaway file is refused unread.
MAX_YAML_BYTES = 4 * 1024 * 1024
# What aliases may add when written out, in nodes plus scalar characters (a node with its text).
MAX_ALIAS_GROWTH = 100_000


def load(path: Path, typ: str = "safe"):
    """The YAML document in ``path`` (``typ``: ruamel's "safe" for plain values, "rt" to keep
    comments for rewriting); a file too large, unreadable, not UTF-8, not YAML, or expanding past
    the bounds above is one UserError naming it. Pure Python, so every install gives the same
    messages and the same bounds."""
    text = read_text(path)
    try:
        node = YAML(typ=typ, pure=True).compose(text)
        problem = node is not None and expansion_problem(node)
        if problem:
            raise UserError(f"{path}: {problem}")
        return YAML(typ=typ, pure=True).load(text)
    except YAMLError as exc:
        raise UserError(yaml_problem(path, exc)) from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a specdec file") from None


def read_text(path: Path) -> str:
    """The file's text, its size checked before it is read."""
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise UserError(f"{path}: {size:,} bytes; specdec's YAML files are at most {MAX_YAML_BYTES:,}")
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a directory; name a YAML file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def expansion_problem(root) -> str | None:
    """Why the document at ``root`` is refused (one clause), or None: a node that contains itself, or
    aliases that add more than MAX_ALIAS_GROWTH when written out. Each distinct node is visited once
    (without recursion: depth is the composer's to bound), so a bomb costs what its file does."""
    sizes: dict[int, int] = {}  # a node's written-out size, once known
    own = 0  # the document's size with each node counted once
    open_nodes: set[int] = set()  # the nodes on the path from the root to the one being visited
    stack = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            weight = 1 + (len(node.value) if isinstance(node, ScalarNode) else 0)
            own += weight
            sizes[key] = weight + sum(sizes[id(child)] for child in children(node))
        elif key in open_nodes:
            return "an alias refers to a node that contains it; write the value out instead"
        elif key not in sizes:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children(node))
    growth = sizes[id(root)] - own
    if growth > MAX_ALIAS_GROWTH:
        return (f"its aliases add {growth:,} nodes and characters when written out, more than {MAX_ALIAS_GROWTH:,}; "
                "write shared values out, or share fewer")
    return None


def children(node) -> list:
    """A collection node's nodes (a mapping's keys and values); a scalar has none."""
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, SequenceNode) else []


def yaml_problem(path: Path, exc: Exception) -> str:
    """`FILE, line L, column C: not valid YAML (what the parser found)`: where to look, in one line."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    return f"{path}{where}: not valid YAML ({problem}{f' {context}' if context else ''})"
