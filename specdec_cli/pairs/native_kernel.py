"""Whether a quantised target runs on specdec's own kernels (runtime/native_kernels.py), decided once a
process when a target is loaded: the library is found, or compiled, under specdec's cache. Where it
cannot run, torch's int4/int8 kernels do, and the user is told why, once. ``python3 -m
specdec_cli.pairs.native_kernel`` (install.sh) compiles it ahead of the first run."""

from __future__ import annotations

import sys

from ..notices import log
from ..runtime import native_kernels
from .cache_dir import cache_root

_told: list[str] = []


def native_kernel() -> bool:
    try:
        native_kernels.load(cache_root())
    except native_kernels.Unavailable as exc:
        if not _told:
            _told.append(str(exc))
            log.warning(f"specdec's int8 matmul kernel is not available ({exc}): the target runs on torch's "
                        "int4/int8 kernels, whose verify blocks cost more")
        return False
    return True


if __name__ == "__main__":
    try:
        path = native_kernels.load(cache_root())
        print(f"specdec's int8 matmul kernel ready ({path}) at {native_kernels.library_path(cache_root())}", file=sys.stderr)
    except native_kernels.Unavailable as exc:
        print(f"specdec's int8 matmul kernel is not available ({exc}): torch's kernels will run", file=sys.stderr)
