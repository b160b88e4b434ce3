"""Faults of specdec's cache: damaged entries are found and rebuilt, what a killed writer left is
removed by the next run, and a cache that cannot be written is one line (or one warning), never a
traceback."""

import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import char_tokenizer, tiny_llama
from prepared_support import forwards, spec, tied_target
from transformers import LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding import blocks
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.errors import UserError
from specdec_cli.pairs import cache_dir, conversion, loading
from specdec_cli.pairs.registry import DrafterSpec, ModelSpec, PairSpec
from specdec_cli.pairs.sources import ModelSource
from specdec_cli.runtime import native_kernels, sampled_digest, staging
from specdec_cli.runtime.sampled_digest import SAMPLE, STRIDE, tensor_digest

TESTS = Path(__file__).parent
WRITE_HERE = "set SPECDEC_CACHE to a directory you can write"
REFUSED = r"\((Permission denied|Operation not permitted)\)"  # chmod for a user, chattr +i for root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tied_target(tmp_path_factory.mktemp("faults") / "target", seed=11)


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    """A tied Llama whose embedding alone is 4 MiB: big enough that a damaged mebibyte lies inside one tensor."""
    root = tmp_path_factory.mktemp("wide") / "target"
    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=1, tie_word_embeddings=True)
    LlamaForCausalLM(config).eval().save_pretrained(root)
    char_tokenizer().save_pretrained(root)
    return root


def builds(monkeypatch) -> list[int]:
    calls = []
    original = loading._quantised
    monkeypatch.setattr(loading, "_quantised", lambda *args: calls.append(1) or original(*args))
    return calls


def notices(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "specdec"]


def damage(path: Path, offset: int, length: int) -> None:
    """Random bytes over ``length`` bytes of ``path`` from ``offset``, as the tester wrote them."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        old = handle.read(length)
        new = bytes((b + 1 + i % 255) % 256 for i, b in enumerate(old))  # every byte changed
        handle.seek(offset)
        handle.write(new)


def largest_tensor_start(path: Path) -> int:
    """Where the largest tensor's bytes start in a torch.save file (a zip archive)."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    assert info.file_size >= 4 * STRIDE
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        name, extra = struct.unpack("<HH", handle.read(30)[26:30])
    return info.header_offset + 30 + name + extra


@contextmanager
def read_only(directory: Path):
    """``directory`` made unwritable for this process. Root writes through chmod, so for root the
    directory is made immutable (chattr +i), which refuses root too; the write is tried to be sure."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"chattr +i is refused here, so root cannot be kept from writing: {done.stderr.strip()}")
        restore = ["chattr", "-i", str(directory)]
    else:
        directory.chmod(0o555)
        restore = None
    try:
        with pytest.raises(PermissionError):
            (directory / "probe").touch()
        yield
    finally:
        if restore:
            subprocess.run(restore, check=True)
        else:
            directory.chmod(0o755)


# 1. Damaged entries: found by their digest, rebuilt with one warning.

@pytest.mark.parametrize("offset", [0, 1, STRIDE - 1, STRIDE + 4321, 3 * STRIDE - 700, 4 * STRIDE - 1])
def test_any_damaged_mebibyte_changes_the_digest(offset):
    """Tensors laid end to end (5 MiB, a few small ones between): a run of STRIDE bytes anywhere,
    across a tensor's end too, changes the digest; so does a shape that keeps the bytes."""
    generator = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randint(0, 256, (2 * STRIDE - 3,), dtype=torch.uint8, generator=generator),
               "b": torch.randn(7, generator=generator),
               "c": torch.randn(STRIDE // 4 - 5, 2, generator=generator).to(torch.bfloat16),
               "d": torch.randint(0, 256, (2 * STRIDE + 5000,), dtype=torch.uint8, generator=generator)}
    stream = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors.values()])
    length = min(STRIDE, len(stream) - offset)
    assert length == STRIDE
    want = tensor_digest(tensors, "{}")
    damaged = stream.clone()
    damaged[offset:offset + length] ^= 0x5A
    pieces, start = {}, 0
    for name, tensor in tensors.items():
        pieces[name] = damaged[start:start + tensor.nbytes].clone().view(tensor.dtype).view(tensor.shape)
        start += tensor.nbytes
    assert tensor_digest(pieces, "{}") != want
    assert tensor_digest(tensors, "{}") == want
    assert tensor_digest({**tensors, "b": tensors["b"].view(1, 7)}, "{}") != want
    assert tensor_digest(tensors, '{"other": 1}') != want


def test_random_bytes_inside_a_prepared_target_rebuild_it_with_one_warning(wide_dir, cache, monkeypatch, caplog):
    """The tester's fault: bytes overwritten in the middle of the file's data, nothing else touched."""
    want = forwards(loading.load(spec(wide_dir, "int4")).model)
    (path,) = cache.glob("prepared-*.pt")
    damage(path, largest_tensor_start(path) + 12345, STRIDE)  # inside the 4 MiB embedding
    counted = builds(monkeypatch)
    caplog.set_level(logging.INFO, logger="specdec")
    got = forwards(loading.load(spec(wide_dir, "int4")).model)
    (notice,) = notices(caplog)
    assert notice[0] == logging.WARNING
    assert notice[1] == (f"the prepared target is unusable ({path}: its tensors do not match the digest saved with "
                         "them (the file is damaged)); preparing it again")
    assert counted == [1] and all(torch.equal(a, b) for a, b in zip(want, got))
    caplog.clear()
    loading.load(spec(wide_dir, "int4"))  # the rebuilt file is used, silently
    assert counted == [1] and not notices(caplog)


@pytest.fixture
def gguf_source(model_dir, tmp_path, monkeypatch):
    """A GGUF source whose conversion copies ``model_dir``: the real conversion reads a real GGUF file."""
    gguf = tmp_path / "models" / "tiny.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    calls = []

    def convert(source, directory, gguf_file, into):
        calls.append(gguf_file)
        for path in Path(model_dir).iterdir():
            shutil.copy(path, into / path.name)
    monkeypatch.setattr(conversion, "_convert", convert)
    return ModelSource.parse(str(gguf)), calls


def test_two_conversions_started_at_once_convert_once(gguf_source, cache, monkeypatch):
    """The second waits for the first (the cache directory's lock) and reads its conversion."""
    source, calls = gguf_source
    directory, name = str(source.local_path().parent), source.local_path().name
    copy, inside = conversion._convert, threading.Event()

    def slow(*args):
        inside.set()
        time.sleep(0.5)  # the second caller arrives while the first converts
        copy(*args)
    monkeypatch.setattr(conversion, "_convert", slow)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(conversion.converted, source, directory, name, weights=False)
        inside.wait(10)
        second = pool.submit(conversion.converted, source, directory, name, weights=False)
        assert first.result() == second.result()
    assert calls == ["tiny.gguf"]


def test_a_damaged_conversion_is_converted_again_where_its_files_are_read(gguf_source, cache, caplog):
    source, calls = gguf_source
    directory, name = str(source.local_path().parent), source.local_path().name
    target = Path(conversion.converted(source, directory, name, weights=False))
    assert calls == ["tiny.gguf"] and (target / conversion.DIGESTS).is_file()
    caplog.set_level(logging.INFO, logger="specdec")
    damage(target / "model.safetensors", 200, 64)  # read only when a target is prepared from it
    caplog.clear()
    assert conversion.converted(source, directory, name, weights=False) == str(target)
    assert calls == ["tiny.gguf"] and not notices(caplog)
    damage(target / "tokenizer.json", 10, 64)  # read at every start
    caplog.clear()
    conversion.converted(source, directory, name, weights=False)
    assert calls == ["tiny.gguf"] * 2
    assert notices(caplog)[0] == (logging.WARNING, ("the conversion of tiny.gguf is damaged (tokenizer.json does not "
                                                    "match its digest); converting it again"))
    assert [n[0] for n in notices(caplog)] == [logging.WARNING, logging.INFO]  # and "converting tiny.gguf once"
    # Through the loader: a quantised target is prepared from the GGUF itself, never from these weights;
    # a model loaded unquantised reads them, and checks them first.
    loading.load(ModelSpec(source, "float32"))
    damage(target / "model.safetensors", 200, 64)
    caplog.clear()
    loading.load(ModelSpec(source, "float32"))
    assert calls == ["tiny.gguf"] * 3
    assert [n for n in notices(caplog) if n[0] == logging.WARNING] == [
        (logging.WARNING, ("the conversion of tiny.gguf is damaged (model.safetensors does not match its digest); "
                           "converting it again"))]


# 2. What a killed writer left: removed by the next run, and only that.

KILLED = {
    "prepared": """
from prepared_support import spec
from specdec_cli.pairs import loading
real = torch.save
def save(*args, **kwargs):
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = save
loading.load(spec(sys.argv[1], "int4"))
""",
    "kernels": """
from specdec_cli.runtime import native_kernels
run = native_kernels.subprocess.run
def compile(command, **kwargs):
    if "-o" not in command:  # the compiler's version
        return run(command, **kwargs)
    Path(command[command.index("-o") + 1]).write_bytes(b"half a library")
    os.kill(os.getpid(), signal.SIGKILL)
native_kernels.subprocess.run = compile
native_kernels.build(Path(os.environ["SPECDEC_CACHE"]) / "kernels" / "specdec_kernels-0.so")
""",
    "conversion": """
from specdec_cli.pairs import conversion
from specdec_cli.pairs.sources import ModelSource
def convert(source, directory, gguf_file, into):
    (into / "model.safetensors").write_bytes(b"half a conversion")
    os.kill(os.getpid(), signal.SIGKILL)
conversion._convert = convert
gguf = Path(sys.argv[1]) / "tiny.gguf"
gguf.write_bytes(b"GGUF")
conversion.converted(ModelSource.parse(str(gguf)), sys.argv[1], "tiny.gguf")
""",
}


def dot_entries(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob(".*"))


@pytest.mark.parametrize("writer", sorted(KILLED))
def test_what_a_writer_killed_mid_write_left_is_removed_by_the_next_run(writer, model_dir, cache, tmp_path, monkeypatch):
    argument = str(model_dir) if writer == "prepared" else str(tmp_path)
    script = "import os, signal, sys, torch\nfrom pathlib import Path\n" + KILLED[writer]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script, argument], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert dot_entries(cache)  # what it was writing
    monkeypatch.delenv("SPECDEC_KERNELS")  # the next run's kernels are under this cache, swept with it
    cache_dir.open_cache()
    assert dot_entries(cache) == []


def test_a_staging_directory_whose_writer_lives_is_kept(cache):
    cache.mkdir()
    script = ("import sys, time\nfrom pathlib import Path\nfrom specdec_cli.runtime import staging\n"
              "with staging.staging(Path(sys.argv[1])) as path:\n    print(path, flush=True)\n    time.sleep(300)\n")
    writer = subprocess.Popen([sys.executable, "-c", script, str(cache)], stdout=subprocess.PIPE, text=True)
    try:
        path = Path(writer.stdout.readline().strip())
        assert path.is_dir() and path.name.startswith(staging.PREFIX)
        assert staging.sweep(cache) == [] and path.is_dir()
    finally:
        writer.kill()
        writer.wait()
    assert staging.sweep(cache) == [path] and not path.exists()


def test_an_earlier_versions_leftovers_go_once_older_than_any_write(cache, monkeypatch):
    monkeypatch.delenv("SPECDEC_KERNELS")  # the kernels under this cache
    (cache / "kernels").mkdir(parents=True)
    old = [cache / ".converting-abc123", cache / ".prepared-x-1-2.pt.k9f8", cache / "kernels" / ".specdec_kernels-1.so.q1"]
    fresh = [cache / ".converting-new", cache / ".prepared-x-1-2.pt.new"]
    kept = [cache / "prepared-x-1-2.pt", cache / "block-costs-1.json", cache / ".xdg-cache"]
    for path in old + fresh + kept:
        path.mkdir() if "converting" in path.name or path.name == ".xdg-cache" else path.write_bytes(b"x")
    hours_ago = time.time() - 2 * staging.LEGACY_AGE_S
    for path in old:
        os.utime(path, (hours_ago, hours_ago))
    cache_dir.open_cache()
    assert [p.exists() for p in old + fresh + kept] == [False] * len(old) + [True] * (len(fresh) + len(kept))


def test_a_draft_refused_for_its_tokenizer_leaves_no_prepared_file(pair_dir, cache):
    pair = PairSpec("alien", ModelSpec(ModelSource.parse(str(pair_dir / "target")), "int4"),
                    DrafterSpec(ModelSpec(ModelSource.parse(str(pair_dir / "alien")), "int4")))
    with pytest.raises(UserError, match="incompatible tokenizers"):
        load_pair(pair)
    assert len(list(cache.glob("prepared-*.pt"))) == 1  # the target's


# 3. A cache that cannot be written.

runner = CliRunner()


def test_a_cache_that_is_a_regular_file_is_one_line_before_any_work(pair_dir, cache, monkeypatch):
    cache.parent.mkdir(exist_ok=True)
    cache.write_text("not a directory")
    for root in (cache, cache / "below"):
        monkeypatch.setenv("SPECDEC_CACHE", str(root))
        result = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-ngram",
                                     "--dtype", "int4", "--max-new-tokens", "4", "abc"])
        assert result.exit_code == 2, result.output
        where = f" ({cache} is not one)" if root != cache else ""
        assert " ".join(result.stderr.split()) == f"specdec: error: the specdec cache {root} is not a directory{where}: {WRITE_HERE}"
        assert "Traceback" not in result.output


def test_a_read_only_cache_without_the_conversion_is_one_line_before_the_conversion(gguf_source, cache):
    source, calls = gguf_source
    cache.mkdir()
    with read_only(cache), pytest.raises(UserError) as refused:
        loading.load(ModelSpec(source, "int8"))
    assert calls == []  # refused before the work
    target = cache / conversion.cache_key(source, str(source.local_path().parent), "tiny.gguf")
    assert re.fullmatch(rf"the conversion of tiny.gguf: cannot write {re.escape(str(target))} {REFUSED}: {WRITE_HERE}",
                        str(refused.value))


def test_a_read_only_cache_is_read_and_a_missing_prepared_target_runs_from_memory_with_one_warning(
        model_dir, cache, monkeypatch, caplog):
    want = forwards(loading.load(spec(model_dir, "int4")).model)
    counted = builds(monkeypatch)
    caplog.set_level(logging.INFO, logger="specdec")
    with read_only(cache):
        got = forwards(loading.load(spec(model_dir, "int4")).model)  # valid: only read
        assert counted == [] and not notices(caplog)
        assert all(torch.equal(a, b) for a, b in zip(want, got))
    (path,) = cache.glob("prepared-*.pt")
    path.unlink()
    with read_only(cache):
        got = forwards(loading.load(spec(model_dir, "int4")).model)
    assert counted == [1] and all(torch.equal(a, b) for a, b in zip(want, got))
    (notice,) = notices(caplog)
    assert notice[0] == logging.WARNING
    assert re.fullmatch(rf"the prepared target is not kept, so it is prepared again at every start: cannot write "
                        rf"{re.escape(str(path))} {REFUSED}: {WRITE_HERE}", notice[1])
    assert list(cache.iterdir()) == []


def test_kernels_that_cannot_be_written_are_unavailable_not_a_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(native_kernels.Unavailable, match=f"^cannot write {blocker}/kernels \\(Not a directory\\): {WRITE_HERE}$"):
        native_kernels.build(blocker / "kernels" / "specdec_kernels-0.so")


def test_block_costs_that_cannot_be_written_are_measured_with_one_warning(cache, monkeypatch, caplog):
    cache.mkdir()
    costs = {n: 1.0 + n / 100 for n in range(1, 11)}
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: costs)
    caplog.set_level(logging.INFO, logger="specdec")
    with read_only(cache):
        assert blocks.cached_costs(tiny_llama(seed=1), "tiny", cache) == costs
    (measuring, notice) = notices(caplog)
    assert measuring == (logging.INFO, f"timing verify blocks of 1 to 10 tokens on this machine (once: kept in {cache})")
    assert notice[0] == logging.WARNING
    assert re.fullmatch(rf"the block costs are not kept, so they are measured again at every start: cannot write "
                        rf"{re.escape(str(cache))}/block-costs-[0-9a-f]{{16}}\.json {REFUSED}: {WRITE_HERE}", notice[1])


def test_the_sampled_offsets_cover_every_stride_and_the_end():
    assert sampled_digest.starts(0) == []
    assert sampled_digest.starts(10) == [0]
    assert sampled_digest.starts(3 * STRIDE) == [0, STRIDE, 2 * STRIDE, 3 * STRIDE - SAMPLE]
