"""`specdec export-head DIR --format eagle3 --out OUT`: a trained head in the layout vLLM (or, with
--engine llama.cpp, llama.cpp's converter) loads."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import own_files
from ..atomic import check_writable
from ..errors import UserError
from ..runtime import threads as thread_policy
from .common import plain_console, user_errors


@user_errors
def export_head_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A draft head written by `specdec train-draft --kind head`.")],
    out: Annotated[Path, typer.Option("--out", "-o", metavar="OUT", help="Directory to write (config.json, model.safetensors): vLLM's --speculative-config model, or what llama.cpp's convert_hf_to_gguf.py reads.")],
    fmt: Annotated[str, typer.Option("--format", metavar="FORMAT", help="eagle3: the LlamaForCausalLMEagle3 checkpoint layout.")] = "eagle3",
    engine: Annotated[str, typer.Option("--engine", metavar="ENGINE", help="Whose EAGLE-3 layer: vllm (method eagle3) or llama.cpp (--spec-type draft-eagle3), whose layer has no attention biases and reads layer inputs only, so the export drops the map's bias term and gives the last layer's input for the last state.")] = "vllm",
    target: Annotated[Optional[str], typer.Option("--target", metavar="SOURCE", help="The head's target, if it moved since training (default: the source in the head's metadata).")] = None,
) -> None:
    """Write a draft head in the EAGLE-3 layout vLLM loads as `method: eagle3`, and say what the
    map kept: teacher-forced first-token agreement with the target, before and after.

    specdec's head and vLLM's EAGLE-3 layer share the MLP, attention output, norms and vocabulary,
    but not the input side: vLLM normalises the embedding and the feature apart and keeps the
    feature alone as the residual; specdec folds both in one linear layer first. Those parts are
    approximated with scales measured on the target (docs/export.md), so acceptance in vLLM can be
    lower than in specdec.

    llama.cpp's layer has no attention biases and is handed layer inputs only: `--engine llama.cpp`
    writes the map without the biases (fc's bias is lost), with the last layer's input standing in
    for the last state, and prints the converter's command.

    Exit codes: 0 written; 2 bad input.
    """
    if not directory.is_dir():
        raise UserError(f"head directory not found: {directory}")
    check_writable(out, "--out", directory=True, ours=own_files.eagle3_export)
    thread_policy.apply(None)  # before torch loads: it runs the target
    from ..export.head_export import export_head as write
    from ..pairs.loading import load
    from ..pairs.registry import ModelSpec
    from ..pairs.sources import ModelSource

    def load_target(source: str):
        loaded = load(ModelSpec(ModelSource.parse(target or source), dtype="float32", device_map="cpu"))
        return loaded.model, loaded.tokenizer

    result = write(directory, out, fmt, load_target, engine=engine)
    console = plain_console()
    console.print(f"wrote {result.directory} (LlamaForCausalLMEagle3: aux layers {result.aux_ids}, draft vocabulary "
                  f"{result.draft_vocab})", markup=False)
    console.print(f"teacher-forced first-token agreement with the target on {result.positions} positions: specdec's head "
                  f"{result.agreement_specdec:.3f}, the export {result.agreement_exported:.3f}", markup=False)
    if engine == "llama.cpp":
        console.print(f"convert it: python convert_hf_to_gguf.py {result.directory} --target-model-dir TARGET_HF_DIR "
                      f"--outfile {result.directory}.gguf (llama.cpp's converter; bench --modes llama-eagle3:K does this itself)",
                      markup=False)
        from ..serving.llama_server import speculative_flags  # llama-eagle3:3's own flags

        flags = speculative_flags("draft-eagle3", 3, Path(f"{result.directory}.gguf"))
        console.print(f"serve it: {shlex.join(['llama-server', '-m', 'TARGET.gguf', *flags])}", markup=False)
        return
    console.print(f"serve it: --speculative-config '{{\"method\": \"eagle3\", \"model\": \"{result.directory}\", "
                  "\"num_speculative_tokens\": 3}'", markup=False)
