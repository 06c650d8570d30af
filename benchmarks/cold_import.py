"""What a fresh machine's first GPU start reads from disk (issue 39, the 8 s fresh target): which of
PyTorch's and CUDA's library files ``import torch``, CUDA's start and the first cuDNN convolution
bring into the page cache, and how long each step takes.

    python -m benchmarks.cold_import [--json OUT]
    python -m benchmarks.cold_import --evict [--rounds 2] [--json OUT]

Linux only (``mincore``, ``/proc/self/io``). Run it as the first Python of a fresh device machine
(`gpu_check.sh coldimport`, the first step of the session's first call): on a warm machine the
files are already cached and the table says so. Per library file under ``torch/lib``,
``nvidia/*/lib`` and CuPy: its size and the share of it in the page cache before and after the
steps (``mincore`` on a read-only mapping: nothing is read to ask). The process's own disk reads
(``read_bytes`` of ``/proc/self/io``) per step. What this is for: reading ahead only the parts a
start needs, in the order it needs them, beside the interpreter's start (a fresh H200 host took
8.6 s to import torch against 2.3 s warm), instead of guessing; every CUDA library whole is 3-4 GB.

``--evict`` makes every start cold again, so reading ahead can be compared in one call: before each
start the files (the libraries and the ``.pyc`` of torch, CuPy and the NVIDIA wheels) are dropped
from the page cache (``posix_fadvise(DONTNEED)``: clean pages nobody maps; what is left resident is
reported), then a fresh process runs the steps with one way of reading ahead, begun as its first act
beside the imports: ``none``; ``read`` (the files the reference start touched, whole, read by 4
threads); ``willneed`` (the same files, ``posix_fadvise(WILLNEED)``: the kernel reads them); ``ranges``
(only the pages the reference start touched, ``WILLNEED``). The reference start is a first evicted
start without reading ahead, whose touched pages ``mincore`` reads after it. The variants alternate
(ABCD, DCBA, ...) over ``--rounds``. Where eviction does not make a start slower than a warm one
(a fast local disk, or storage cached below the machine), the table says so and nothing is learnt.
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
import statistics
import subprocess
import sys
import tempfile
import threading
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
    size, pages = resident_pages(path)
    return size, sum(pages) * mmap.PAGESIZE


def resident_pages(path: Path) -> tuple[int, list[int]]:
    """(bytes of ``path``, 1 or 0 per page: in the page cache or not), by ``mincore`` on a read-only
    mapping; no pages where it cannot be mapped."""
    size = path.stat().st_size
    if size == 0:
        return 0, []
    libc = _libc()
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return size, []
        try:
            vec = ctypes.create_string_buffer((size + page - 1) // page)
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return size, []
            return size, [b & 1 for b in vec.raw[: (size + page - 1) // page]]
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


def python_files() -> list[Path]:
    """The compiled Python modules of torch, CuPy and the NVIDIA wheels (``import torch`` opens
    about two thousand of them): beside the sources, or under ``$PYTHONPYCACHEPREFIX`` where it is
    set (gpu_check.sh sets it: the device image ships no bytecode)."""
    site = _site()
    if site is None:
        return []
    roots = [site]
    if sys.pycache_prefix:
        roots.append(Path(sys.pycache_prefix + str(site.resolve())))
    found: list[Path] = []
    for root in roots:
        for top in ("torch", "cupy", "cupy_backends", "nvidia"):
            found += [Path(p) for p in glob.glob(str(root / top / "**" / "*.pyc"), recursive=True)]
    return sorted({p for p in found if p.is_file()})


def evict(files: list[Path]) -> int:
    """Drop ``files`` from the page cache (``posix_fadvise(DONTNEED)``: clean pages no process maps);
    the bytes of them still resident after."""
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return sum(resident(p)[1] for p in files)


def touched_ranges(files: list[Path]) -> list[tuple[str, int, int]]:
    """(file, offset, length) of each run of pages of ``files`` in the page cache now."""
    out: list[tuple[str, int, int]] = []
    page = mmap.PAGESIZE
    for path in files:
        _, pages = resident_pages(path)
        start = None
        for i, bit in enumerate([*pages, 0]):
            if bit and start is None:
                start = i
            elif not bit and start is not None:
                out.append((str(path), start * page, (i - start) * page))
                start = None
    return out


VARIANTS = ("none", "read", "willneed", "ranges")


def read_ahead(variant: str, plan: dict) -> list[threading.Thread]:
    """Begin reading ahead the way ``variant`` says (:data:`VARIANTS`) from ``plan`` (the reference
    start's touched files and ranges), in threads that run beside the caller's imports."""
    if variant == "none":
        return []
    if variant == "read":
        files = list(plan["files"])

        def reader() -> None:
            while files:
                try:
                    path = files.pop(0)
                except IndexError:
                    return
                try:
                    with open(path, "rb", buffering=0) as fh:
                        while fh.read(8 << 20):
                            pass
                except OSError:
                    continue

        threads = [threading.Thread(target=reader, daemon=True) for _ in range(4)]
    else:
        ranges = [(f, 0, 0) for f in plan["files"]] if variant == "willneed" else plan["ranges"]

        def advise() -> None:
            for name, offset, length in ranges:
                try:
                    fd = os.open(name, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)

        threads = [threading.Thread(target=advise, daemon=True)]
    for t in threads:
        t.start()
    return threads


def child(variant: str, plan_path: Path | None) -> None:
    """One start in this fresh process: read ahead as ``variant`` says, then the steps; one JSON line."""
    t0 = time.perf_counter()
    plan = json.loads(plan_path.read_text()) if plan_path is not None else {"files": [], "ranges": []}
    readers = read_ahead(variant, plan)
    timeline = steps()
    total = time.perf_counter() - t0
    ahead_done = not any(t.is_alive() for t in readers)
    steps_out = [[n, s, b] for n, s, b in timeline]
    print(json.dumps({"variant": variant, "steps": steps_out, "seconds": total, "ahead_done": ahead_done}))


def start(variant: str, plan_path: Path | None) -> dict:
    """A fresh interpreter running :func:`child`; its JSON line, with the process's wall time."""
    cmd = [sys.executable, "-m", "benchmarks.cold_import", "--child", variant]
    if plan_path is not None:
        cmd += ["--plan", str(plan_path)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parent.parent)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - t0
    return row


def compare(rounds: int, folder: Path) -> dict:
    """The ``--evict`` table: a warm start, the evicted reference start, then :data:`VARIANTS`
    alternated over ``rounds``, each start evicted first."""
    libs, pyc = library_files(), python_files()
    files = libs + pyc
    total_mb = sum(p.stat().st_size for p in files) / 1e6
    warm = start("none", None)  # the files cached (a second start of a warm machine)
    left = evict(files)
    ref = start("none", None)
    ranges = touched_ranges(files)
    touched = sorted({name for name, _, _ in ranges}, key=lambda n: (not n.endswith(".so") and ".so." not in n, n))
    plan = {"files": touched, "ranges": ranges}
    plan_path = folder / "cold_plan.json"
    plan_path.write_text(json.dumps(plan))
    rows = [dict(warm, kind="warm"), dict(ref, kind="reference", left_mb=left / 1e6)]
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            left = evict(files)
            rows.append(dict(start(variant, plan_path), kind="evicted", left_mb=left / 1e6, round=r))
    touched_mb = sum(length for _, _, length in ranges) / 1e6
    whole_mb = sum(Path(n).stat().st_size for n in touched) / 1e6
    print(
        f"{len(files)} files ({len(libs)} libraries, {len(pyc)} .pyc), {total_mb:.0f} MB; the reference start touched "
        f"{len(touched)} of them, {touched_mb:.0f} MB of pages ({whole_mb:.0f} MB whole)"
    )
    names = [n for n, _, _ in ref["steps"]]
    print(f"{'start':22} {'left MB':>8} {'ahead done':>10} {'process s':>10} " + " ".join(f"{n[:18]:>18}" for n in names))
    for row in rows:
        label = row["kind"] if row["kind"] != "evicted" else f"evicted {row['variant']}"
        by = {n: s for n, s, _ in row["steps"]}
        cells = " ".join(f"{by.get(n, float('nan')):18.2f}" for n in names)
        left = f"{row['left_mb']:8.0f}" if "left_mb" in row else f"{'-':>8}"
        print(f"{label:22} {left} {str(row['ahead_done']):>10} {row['process_s']:10.2f} {cells}")
    summary = {}
    for variant in VARIANTS:
        runs = [r["process_s"] for r in rows if r["kind"] == "evicted" and r["variant"] == variant]
        if runs:
            summary[variant] = statistics.median(runs)
    print(
        "median process seconds, evicted: "
        + ", ".join(f"{k} {v:.2f}" for k, v in summary.items())
        + f"; warm {warm['process_s']:.2f}"
    )
    if summary.get("none", 0.0) < 1.2 * warm["process_s"]:
        print("eviction does not make a start slower here (a fast disk, or storage cached below the machine): nothing learnt")
    return {
        "files": len(files),
        "total_mb": total_mb,
        "touched_mb": touched_mb,
        "touched_whole_mb": whole_mb,
        "rows": rows,
        "median_s": summary,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--evict", action="store_true", help="cold starts made by eviction, reading ahead compared")
    ap.add_argument("--rounds", type=int, default=2, help="with --evict: rounds of the variants, alternated")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux"):
        ap.error("Linux only (mincore, /proc/self/io)")
    if args.child:
        child(args.child, args.plan)
        return {}
    if args.evict:
        folder = args.json.parent if args.json is not None else Path(tempfile.mkdtemp(prefix="cold-"))
        result = compare(args.rounds, folder)
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=1))
        return result
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
