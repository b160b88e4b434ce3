"""`specdec models`: the registered pairs, and whether each can run without a network."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ..registry import load_registry
from .common import ModelsOption, user_errors


@user_errors
def models(
    models: ModelsOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per pair.")] = False,
) -> None:
    """List the pairs in models.yaml and whether each is available offline."""
    registry = load_registry(models)
    rows = []
    for name, pair in registry.pairs.items():
        head = pair.drafter.head
        draft = str(pair.drafter.model.source) if pair.drafter.model else f"head {head}" if head else "ngram (prompt lookup)"
        offline = pair.target.source.available_offline() and (
            pair.drafter.model.source.available_offline() if pair.drafter.model else head is None or head.is_dir()
        )
        rows.append(dict(name=name, default=name == registry.default, target=str(pair.target.source),
                         draft=draft, k=pair.k, scenarios=pair.scenarios, offline=offline))
    if json_out:
        for row in rows:
            print(json.dumps(row))
        return
    table = Table(title=f"pairs in {registry.path}", title_justify="left")
    for column in ("pair", "target", "draft", "K", "offline"):
        table.add_column(column, overflow="fold")
    for row in rows:
        k = str(row["k"]) + "".join(f"\n{s}: {v}" for s, v in row["scenarios"].items())
        table.add_row(row["name"] + (" (default)" if row["default"] else ""), row["target"], row["draft"], k,
                      "[green]yes[/]" if row["offline"] else "[dim]no[/]")
    Console().print(table)
