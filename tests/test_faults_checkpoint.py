"""A training checkpoint is read as data only: a file planted in --out (or --data-from) that would run
code when unpickled runs nothing, and is named as not a checkpoint specdec wrote."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from specdec_cli.cli import app

runner = CliRunner()


class _Planted:
    """Unpickling this runs ``touch MARK``: what a full ``torch.load`` of a stranger's file allows."""

    def __init__(self, mark):
        self.mark = str(mark)

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.mark}",)


def _train(pair_dir, out, prompts, *extra):
    return runner.invoke(app, ["train-draft", "--models", str(pair_dir / "models.yaml"), "--out", str(out),
                               "--kind", "head", "--prompts", str(prompts), "--steps", "3", "--max-new-tokens", "8",
                               "--json", *extra])


def _one_line(result) -> str:
    return " ".join(result.stderr.split())


def _planted(tmp_path, name: str):
    """A prompt file, the mark a run of the planted code would leave, and an --out whose checkpoint
    holds the planted ``name``."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello there\nabcabcabc\n")
    mark, out = tmp_path / "PWNED", tmp_path / "ev"
    (out / "checkpoint").mkdir(parents=True)
    torch.save({"x": _Planted(mark)}, out / "checkpoint" / name)
    return prompts, mark, out


def test_a_planted_state_file_runs_nothing_with_or_without_resume(pair_dir, tmp_path):
    prompts, mark, out = _planted(tmp_path, "state.pt")

    fresh = _train(pair_dir, out, prompts)  # state.pt without data.pt: no longer restored, refused
    assert fresh.exit_code == 2, fresh.output
    assert "holds a checkpoint" in _one_line(fresh)

    torch.save({"kind": "head", "target": {"fingerprint": "x", "source": "y"}, "seed": 0, "top_k": 4, "prompts": "p",
                "heldout": [], "top_vocab": None, "examples": []}, out / "checkpoint" / "data.pt")
    resumed = _train(pair_dir, out, prompts, "--resume")
    assert resumed.exit_code == 2, resumed.output
    line = _one_line(resumed)
    assert f"{out / 'checkpoint' / 'state.pt'}: not a checkpoint specdec wrote" in line and "it was not loaded" in line
    assert "Traceback" not in resumed.output
    assert not mark.exists()


def test_a_planted_data_file_runs_nothing_on_resume_or_reuse(pair_dir, tmp_path):
    prompts, mark, out = _planted(tmp_path, "data.pt")
    resumed = _train(pair_dir, out, prompts, "--resume")
    assert resumed.exit_code == 2 and "data.pt: not a checkpoint specdec wrote" in _one_line(resumed), resumed.output
    reused = runner.invoke(app, ["train-draft", "--models", str(pair_dir / "models.yaml"), "--out", str(tmp_path / "new"),
                                 "--kind", "head", "--data-from", str(out), "--steps", "3", "--json"])
    assert reused.exit_code == 2 and "data.pt: not a checkpoint specdec wrote" in _one_line(reused), reused.output
    assert not mark.exists()


def test_a_data_only_file_of_another_shape_is_not_a_checkpoint(pair_dir, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello there\n")
    out = tmp_path / "ev"
    (out / "checkpoint").mkdir(parents=True)
    torch.save({"weights": torch.zeros(2)}, out / "checkpoint" / "data.pt")
    result = _train(pair_dir, out, prompts, "--resume")
    assert result.exit_code == 2, result.output
    assert "not a checkpoint specdec wrote (it lacks kind, target" in _one_line(result)
