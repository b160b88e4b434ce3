"""`specdec models`: the registered pairs, their drafters, which forward each target runs, and
whether each can run without a network.

Besides the default drafter (``draft``) each pair shows the others it can switch to with
``--drafter KIND`` (``drafters``, kind → drafter); availability offline is the default drafter's.
The forward is specdec's lean one or transformers' (pairs/architecture.py: from the target's files,
``unknown`` until they are here)."""

# Light imports only: `specdec models` must answer without loading torch (tests/test_cli.py checks).
from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from ..pairs.architecture import forward_of
from ..pairs.registry import load_registry
from .common import ModelsOption, plain_console, user_errors


@user_errors
def models(
    models: ModelsOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per pair.")] = False,
) -> None:
    """List the pairs in models.yaml, which forward each target runs (lean: specdec's own, for the
    architectures it covers at int8/int4; transformers: its forward with specdec's linears inside;
    unknown: the target's files are not here yet), and whether each is available offline."""
    registry = load_registry(models)
    rows = []
    for name, pair in registry.pairs.items():
        head = pair.drafter.head
        offline = pair.target.source.available_offline() and (
            pair.drafter.model.source.available_offline() if pair.drafter.model else head is None or head.is_dir()
        )
        rows.append(dict(name=name, default=name == registry.default, target=str(pair.target.source),
                         draft=str(pair.drafter), drafters={kind: str(d) for kind, d in pair.alternates.items()},
                         k=pair.k, scenarios=pair.scenarios, forward=forward_of(pair.target.source, pair.target.dtype),
                         offline=offline))
    if json_out:
        for row in rows:
            print(json.dumps(row))
        return
    table = Table(title=f"pairs in {registry.path}", title_justify="left")
    for column in ("pair", "target", "draft", "other drafters", "K", "forward", "offline"):
        table.add_column(column, overflow="fold")
    for row in rows:
        k = str(row["k"]) + "".join(f"\n{s}: {v}" for s, v in row["scenarios"].items())
        others = "\n".join(f"{kind}: {d}" for kind, d in row["drafters"].items() if d != row["draft"])
        table.add_row(row["name"] + (" (default)" if row["default"] else ""), row["target"], row["draft"], others, k,
                      row["forward"], "[green]yes[/]" if row["offline"] else "[dim]no[/]")
    plain_console().print(table)
