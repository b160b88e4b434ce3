"""The pair's head exported once into the cache for `vllm-eagle3:K` servers: reused while the head
and the exporting code are unchanged, exported again when the head changes."""

import shutil
from pathlib import Path

from specdec_cli.export import head_export, served_head

HEAD = Path("specdec_cli/trained/smollm2-135m-head")


def test_the_export_is_written_once_and_follows_the_head(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    head = tmp_path / "head"
    shutil.copytree(HEAD, head)
    calls = []

    def fake_export(directory, out, fmt, load_target, engine):
        calls.append((directory, fmt, engine))
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"x")

    monkeypatch.setattr(head_export, "export_head", fake_export)
    first = served_head.eagle3_directory(head)
    assert served_head.eagle3_directory(head) == first and len(calls) == 1  # cached
    assert first.parent == tmp_path / "cache" / "eagle3" and (first / "config.json").is_file()
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]  # no scratch left
    meta = head / "specdec-draft.json"
    meta.write_text(meta.read_text().replace("{", '{"retrained": true, ', 1))
    second = served_head.eagle3_directory(head)
    assert second != first and len(calls) == 2
    for_llama = served_head.eagle3_directory(head, engine="llama.cpp")  # llama.cpp's bias-free layer: its own export
    assert for_llama not in (first, second) and calls[-1][2] == "llama.cpp" and len(calls) == 3
    assert served_head.eagle3_directory(head, engine="llama.cpp") == for_llama and len(calls) == 3
