"""``--compile``: mends torch inductor's on-disk cache before compiling.

A process killed while inductor's C++ compiler writes a kernel library (a preemption that signals
the whole process group, as Slurm and ``timeout`` do, reaches the compiler too) can leave that
``.so`` cut short in the cache. Inductor then loads it on every later run and fails with "file too
short" (pytorch/pytorch#102539), so the resumed run could never compile. An ELF file is at least
its 64-byte header: any shorter ``.so`` in the cache is such a remnant, and removing it makes
inductor build it again. Only one untouched for ``MIN_AGE_S``: the linker of a compile in flight
(another job of the same user, sharing the folder) may hold a short one for a moment. The ranks of
one run mend after DDP's start, which they pass together, and before any of them compiles.
"""
from __future__ import annotations

import os
import time
from typing import List, Optional

ELF_HEADER = 64   # bytes: the smallest well-formed ELF file
MIN_AGE_S = 30.0  # seconds since a remnant's last change


def cache_dir() -> Optional[str]:
    """Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``, else its default), or None when this
    torch does not say."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir as _cache_dir
        return _cache_dir()
    except Exception:  # noqa: BLE001 - another torch layout: nothing to mend
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def mend(root: Optional[str] = None, min_age_s: float = MIN_AGE_S) -> List[str]:
    """Removes the kernel libraries under ``root`` (default: inductor's cache) shorter than an ELF
    header and unchanged for ``min_age_s``; returns their paths. Other processes may mend the same
    folder at once."""
    root = cache_dir() if root is None else root
    before = time.time() - min_age_s
    removed: List[str] = []
    if not root or not os.path.isdir(root):
        return removed
    for folder, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".so"):
                continue
            path = os.path.join(folder, f)
            try:
                st = os.stat(path)
                if st.st_size < ELF_HEADER and st.st_mtime <= before:
                    os.remove(path)
                    removed.append(path)
            except FileNotFoundError:
                pass                     # another rank removed it first
    return removed
