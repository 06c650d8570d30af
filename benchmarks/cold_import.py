"""What a fresh machine's first GPU start reads from disk (issue 39, the 8 s fresh target): which of
PyTorch's and CUDA's library files ``import torch``, CUDA's start and the first cuDNN convolution
bring into the page cache, and how long each step takes.

    python -m benchmarks.cold_import [--json OUT]

Linux only (``mincore``, ``/proc/self/io``). Run it as the first Python of a fresh device machine
(`gpu_check.sh coldimport`, the first step of the session's first call): on a warm machine the
files are already cached and the table says so. Per library file under ``torch/lib``,
``nvidia/*/lib`` and CuPy: its size and the share of it in the page cache before and after the
steps (``mincore`` on a read-only mapping: nothing is read to ask). The process's own disk reads
(``read_bytes`` of ``/proc/self/io``) per step. What this is for: reading ahead only the parts a
start needs, in the order it needs them, beside the interpreter's start (a fresh H200 host took
8.6 s to import torch against 2.3 s warm), instead of guessing; every CUDA library whole is 3-4 GB.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import glob
import importlib.util
import json
import mmap
import os
import sys
import time
from pathlib import Path


def _site() -> Path | None:
    spec = importlib.util.find_spec("torch")
    return Path(spec.origin).parent.parent if spec is not None and spec.origin else None


def library_files() -> list[Path]:
    """The shared libraries PyTorch, the NVIDIA wheels and CuPy bring (the big reads of a GPU start)."""
    site = _site()
    if site is None:
        return []
    found: list[Path] = []
    for pattern in ("torch/lib/*.so*", "nvidia/*/lib/*.so*", "cupy/**/*.so", "cupy_backends/**/*.so"):
        found += [Path(p) for p in glob.glob(str(site / pattern), recursive=True)]
    return sorted({p for p in found if p.is_file()})


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    """The C library with the prototypes :func:`resident` calls (set once)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    return libc


def resident(path: Path) -> tuple[int, int]:
    """(bytes of ``path``, bytes of it in the page cache), by ``mincore`` on a read-only mapping."""
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    libc = _libc()
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return size, 0
        try:
            vec = ctypes.create_string_buffer((size + page - 1) // page)
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return size, 0
            return size, sum(b & 1 for b in vec.raw) * page
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def read_bytes() -> int:
    """This process's reads from storage so far (``/proc/self/io``), 0 where unreadable."""
    try:
        with open("/proc/self/io") as fh:
            return next(int(ln.split()[1]) for ln in fh if ln.startswith("read_bytes:"))
    except (OSError, StopIteration, ValueError):
        return 0


def steps() -> list[tuple[str, float, int]]:
    """(step, seconds, bytes read from storage) for each step of a GPU start."""
    out = []

    def timed(name: str, fn) -> None:
        r0, t0 = read_bytes(), time.perf_counter()
        fn()
        out.append((name, time.perf_counter() - t0, read_bytes() - r0))

    timed("import torch", lambda: __import__("torch"))
    import torch

    if torch.cuda.is_available():
        timed("torch.cuda.init()", torch.cuda.init)

        def conv() -> None:
            x = torch.randn(1, 3, 128, 128, device="cuda", dtype=torch.float16)
            w = torch.randn(64, 3, 3, 3, device="cuda", dtype=torch.float16)
            torch.nn.functional.conv2d(x, w).sum().item()

        timed("first cuDNN convolution (FP16)", conv)
    if importlib.util.find_spec("cupy") is not None:
        timed("import cupy", lambda: __import__("cupy"))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux"):
        ap.error("Linux only (mincore, /proc/self/io)")
    files = library_files()
    before = {p: resident(p) for p in files}
    t0 = time.perf_counter()
    timeline = steps()
    total = time.perf_counter() - t0
    rows = []
    for p in files:
        size, was = before[p]
        now = resident(p)[1]
        rows.append({"file": str(p), "mb": size / 1e6, "cached_before_mb": was / 1e6, "cached_after_mb": now / 1e6})
    rows.sort(key=lambda r: r["cached_after_mb"] - r["cached_before_mb"], reverse=True)
    print(f"{'step':34} {'s':>7} {'read MB':>9}")
    for name, secs, nbytes in timeline:
        print(f"{name:34} {secs:7.2f} {nbytes / 1e6:9.1f}")
    print(f"{'all':34} {total:7.2f}")
    size = sum(r["mb"] for r in rows)
    was = sum(r["cached_before_mb"] for r in rows)
    now = sum(r["cached_after_mb"] for r in rows)
    print(f"\n{len(rows)} library files, {size:.0f} MB; in the page cache before {was:.0f} MB, after {now:.0f} MB")
    print(f"{'file (most brought in first)':60} {'MB':>8} {'before':>8} {'after':>8}")
    for r in rows[:25]:
        name = r["file"].split("site-packages/")[-1]
        print(f"{name[-60:]:60} {r['mb']:8.1f} {r['cached_before_mb']:8.1f} {r['cached_after_mb']:8.1f}")
    payload = {"steps": [{"step": n, "s": s, "read_mb": b / 1e6} for n, s, b in timeline], "seconds": total, "files": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=1))
    return payload


if __name__ == "__main__":
    main()
