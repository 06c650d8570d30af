"""The first seconds of a live run as a user starts it: does the camera move at its own rate from
the start, within the budget, and when does the GPU swap?

    python -m benchmarks.first_seconds [--device cuda] [--model inswapper_128] [--fp16] [--max-latency 33ms]
        [--input demo|CLIP|faces:N] [--size WxH] [--streams 1] [--duration 20] [--runs 3] [--fps 30] [--window 10]
        [--baseline REF] [--also-env KEY=VALUE] [--prime [--prime-seconds 8]] [--evict] [--phases] [--stalls] [--json OUT]

Each run is a fresh process running the real command (``vcam run --realtime --output null
--duration ... --max-latency ...``, one stream or ``--streams N`` of the same input), with the
full-size stand-in weights of a swap network (:func:`benchmarks.startup._models`: random weights,
the real architecture) and a face photo. The child times every frame the null outputs are sent and
keeps each stream's run summary; per stream:

    published   frames out in the first ``--window`` s after the first one / the camera's frames then (``--fps``)
    p99 ms      capture -> publish over the whole run, start-up included (a baseline that does not count
                its early frames' latency: its pipeline frames only)
    late        frames out over the budget (counted as late: the picture kept moving) / over it not counted
    first s     the first frame out, after the process start
    swapped s   the first frame swapped by the pipeline's device (on the GPU: the switch from the CPU
                swap, else the first through the pipeline)
    CPU s to 1st swapped  the process's CPU seconds (every thread) when the first frame went out through the
                pipeline: on a machine others load, the cost of the start less the waiting for a core

``--baseline REF``: the same runs with another git ref of this repository (checked out once into a
temporary worktree), alternated run by run with this tree (the same machine load); ``--also-env
KEY=VALUE`` (repeatable; several space-separated pairs set together): this tree again with those
environment variables set, alternated too (in the reverse order every second run: ABBA). ``--prime``:
one unmeasured start (``--prime-seconds``, default 8: long enough for a load to end) of each tree before
the runs, so a fresh machine's first-start costs (bytecode written, files first read) fall on no tree.
The table gives
the median of the runs per tree; ``--json`` has every run, with each stream's longest pauses
between two frames out (``gaps``: when, how long). ``--evict``: every start cold (the GPU's library
files dropped from the page cache first: a fresh machine's disk). ``--phases``: the child runs
``vcam -v``; its load phases (what the load did, and when) are kept with the run. ``--stalls``: a
thread in the child asks for the GIL every 2 ms and keeps each wait over 25 ms with where the other
threads stood (:data:`STALLS`): which calls of the load hold the GIL that the early frames need;
the garbage collector's passes of its oldest generation (and any over 5 ms), when and in which
thread (a pass holds the GIL throughout); and each time the frame loop (the main thread) stood at one
line over 40 ms with the GIL free (a lock, a device wait: what a GIL wait does not show), with where
every thread stood then.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The start of a child running the real command: the start-up clock first (vcam.platform.process),
#: then every null output's sends timed from the child's start (``sent``: id of the output -> seconds);
#: ``OUT`` is its first argument. Made here and sent as text, so a baseline tree needs nothing new.
TIMED_OUTPUTS = r"""
import vcam.__main__
import json, sys, time
t0, OUT = time.perf_counter(), sys.argv[1]
from vcam.stages import outputs
sent = {}
send = outputs.NullOutput.send
def timed(self, data):
    sent.setdefault(id(self), []).append(time.perf_counter() - t0)
    return send(self, data)
outputs.NullOutput.send = timed
"""

#: With ``--stalls``: a thread that asks for the GIL every 2 ms and, after each wait over 25 ms, keeps
#: when it was and where each other thread stood (its innermost frames of vcam, torch, cupy or the
#: importer): the thread that held the GIL just let go there, after a long C call or at a blocking one.
STALLS = r"""
import os, threading
stalls = []
#: The main thread (the frame loop) standing at one line over 40 ms while the GIL was free: a blocking
#: call (a lock, a device wait), which a GIL wait does not show; with where every thread stood then.
blocks = []
def _picked(frame, own=0):
    picked, f = [], frame
    while f is not None and len(picked) < 3 + own:
        code = f.f_code
        if code.co_name == "_find_and_load":  # the module being imported
            picked.append(f"import {f.f_locals.get('name')}")
        elif len(picked) < own or any(k in code.co_filename for k in ("vcam", "torch", "cupy", "ctypes")):
            picked.append(f"{os.path.basename(code.co_filename)}:{f.f_lineno} {code.co_name}")
        f = f.f_back
    return picked
def _where(frames, own=0):
    names = {t.ident: t.name for t in threading.enumerate()}
    return {names.get(tid, str(tid)): _picked(frame, own if tid == threading.main_thread().ident else 0)
            for tid, frame in frames.items() if tid != threading.get_ident()}
def _stall_watch():
    import sys as _s
    main = threading.main_thread().ident
    last = time.perf_counter()
    spot, since, block = None, last, None
    while True:
        time.sleep(0.002)
        now = time.perf_counter()
        frames = _s._current_frames()
        if now - last > 0.025 and len(stalls) < 400:
            stalls.append({"at_s": round(last - t0, 3), "ms": round((now - last) * 1000, 1), "where": _where(frames)})
        last = now
        f = frames.get(main)
        here = None if f is None else (f.f_code, f.f_lineno, id(f))
        if here != spot:
            if block is not None:
                block["ms"] = round((now - since) * 1000, 1)
            spot, since, block = here, now, None
        elif block is None and now - since > 0.040 and len(blocks) < 400:
            block = {"at_s": round(since - t0, 3), "ms": None, "where": _where(frames, own=2)}
            blocks.append(block)
collections = []
def _gc_watch(phase, info, _t=[0.0]):
    # every collection of the oldest generation (or any over 5 ms): when, how long, in which thread
    if phase == "start":
        _t[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _t[0]) * 1000
    if (info["generation"] == 2 or ms > 5) and len(collections) < 400:
        collections.append({"at_s": round(_t[0] - t0, 3), "ms": round(ms, 1), "generation": info["generation"],
                            "thread": threading.current_thread().name})
if os.environ.get("FIRST_STALLS"):
    threading.Thread(target=_stall_watch, name="stall-watch", daemon=True).start()
    import gc
    gc.callbacks.append(_gc_watch)
"""

CHILD = (
    TIMED_OUTPUTS
    + STALLS
    + r"""
from vcam import status as vs
first_cpu = {}
published = vs.LiveStats.published
def cpu_first(self, *a, **k):
    if self.summary.frames_out == 0:
        first_cpu.setdefault(id(self), time.process_time())
    return published(self, *a, **k)
vs.LiveStats.published = cpu_first
from vcam.runtime import daemon as vd
run = vd.Daemon.run
def reported(self, *a, **k):
    try:
        return run(self, *a, **k)
    finally:
        rows = {}
        for st in self.streams:
            s = st.summary
            rows[st.name] = {
                "sent": sent.get(id(st.output), []), "latencies_ms": list(s.latencies_ms), "frames_out": s.frames_out,
                "early_frames": s.early_frames, "dropped_latency": s.dropped_latency,
                "published_late": s.published_late + getattr(s, "early_late", 0),
                "cpu_frames": getattr(s, "cpu_frames", 0), "switched_s": getattr(s, "switched_s", None),
                "first_processed_s": s.first_processed_s, "first_frame_s": s.first_frame_s, "device": s.device,
                "first_cpu_s": first_cpu.get(id(st.live)),
            }
        rows["_stalls"] = stalls
        rows["_blocks"] = blocks
        rows["_gc"] = collections
        with open(OUT, "w") as f:
            json.dump(rows, f)
vd.Daemon.run = reported
from vcam.__main__ import main
sys.argv = ["vcam", *sys.argv[2:]]
main()
"""
)


#: The ``vcam -v`` lines ``--phases`` keeps: the load's phases, the start-up's and the switch's
#: lines, the background captures, when each compiled engine was loaded and put in use, and the
#: degrader's changes (a compiled four-stream run of six faces published 60 % without saying whether
#: its artifact was ever in use, or whether the degrader shed a stage).
PHASE_WORDS = ("load phase", "start-up:", "switch", "ahead", "in the background", "compiled engine", "degrade:")


def phase_lines(log: str) -> list[str]:
    """The lines of a run's ``vcam -v`` log that ``--phases`` keeps (:data:`PHASE_WORDS`)."""
    return [ln for ln in log.splitlines() if any(w in ln for w in PHASE_WORDS)]


def _worktree(ref: str) -> Path:
    """``ref`` of this repository checked out (detached) in a temporary folder; a folder given as ``ref``
    (an exported checkout, e.g. ``git archive REF | tar -x -C DIR`` where the tree has no .git) is used as it is."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    here = Path(__file__).resolve().parents[1]
    path = Path(tempfile.mkdtemp(prefix="vcam-baseline-"))
    subprocess.run(["git", "-C", str(here), "worktree", "add", "--detach", str(path), ref], check=True, capture_output=True)
    return path


def _faces_clip(work: Path, faces: int, frames: int = 150) -> Path:
    """A 1920x1080 clip of ``faces`` of the bundled portraits (photographs) drifting on a grid, one
    period of ``frames`` (5 s at 30 fps, seamless where the run loops it), written once into ``work``."""
    from benchmarks.gpu_e2e import make_clip

    path = work / f"faces{faces}_1080p_{frames}.mp4"
    if not path.exists():
        part = path.with_suffix(".part.mp4")
        make_clip(part, frames, faces)
        part.replace(path)
    return path


def _one(
    tree: Path, args: list[str], timeout: float, *, stalls: bool = False, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    env = {
        **os.environ,
        **(extra_env or {}),
        "FIRST_STALLS": "1" if stalls else "",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH", "")])),
    }
    cmd = [sys.executable, "-c", CHILD, str(out), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env, timeout=timeout)
    try:
        rows = json.loads(out.read_text() or "{}")
    except json.JSONDecodeError:
        rows = {}
    out.unlink(missing_ok=True)
    stalls = rows.pop("_stalls", [])
    blocks = rows.pop("_blocks", [])
    collections = rows.pop("_gc", [])
    return {
        "rc": r.returncode, "streams": rows, "tail": (r.stdout + r.stderr)[-800:], "log": r.stderr, "stalls": stalls,
        "gc": collections, "blocks": blocks,
    }  # fmt: skip


#: A load's phase line (``-v``): ``load phase on cuda: import torch 0.86 s (1.83 s after the start)``.
_PHASE_AT = re.compile(r"load phase on \w+: .* \(([0-9.]+) s after the start\)")


def load_done_s(log: str) -> float | None:
    """When the last load phase ended, seconds after the start (None: no phase line; a run without
    ``--phases``). Said on each run's line: two trees' runs whose loads end 0.7 s apart (the imports,
    the detector's first graphs) differ by a slow host before either tree's code could matter."""
    marks = [float(m.group(1)) for m in _PHASE_AT.finditer(log)]
    return max(marks) if marks else None


def env_pairs(text: str) -> dict[str, str]:
    """``--also-env``'s value as variables: ``K=V`` pairs separated by spaces (a value may hold commas)."""
    out = {}
    for pair in text.split():
        key, eq, value = pair.partition("=")
        if not key or not eq:
            raise SystemExit(f"--also-env: expected KEY=VALUE pairs, got {pair!r}")
        out[key] = value
    return out


def _evict() -> float:
    """The GPU start's files (PyTorch's, CuPy's and the NVIDIA wheels' libraries and .pyc) dropped
    from the page cache (:func:`benchmarks.cold_import.evict`): the next start reads them from disk
    as a fresh machine's does. The MB still resident after."""
    from benchmarks.cold_import import evict, library_files, python_files

    return evict(library_files() + python_files()) / 1e6


def gaps(sent: list[float], *, fps: float, top: int = 8) -> list[tuple[float, float]]:
    """The ``top`` longest pauses between two frames out, as (seconds after the start at which the
    pause began, its length in ms), longest first; only pauses over two of the camera's frames."""
    pauses = [(a, (b - a) * 1000.0) for a, b in zip(sent, sent[1:]) if b - a > 2.0 / fps]
    return sorted(pauses, key=lambda p: -p[1])[:top]


def measure(stream: dict[str, Any], *, fps: float, window: float, budget_ms: float) -> dict[str, Any]:
    """One stream's figures (see the module docstring)."""
    import numpy as np

    sent = stream["sent"]
    lat = np.asarray(stream["latencies_ms"], float)
    first = sent[0] if sent else None
    in_window = sum(1 for t in sent if first is not None and t - first < window)
    switched = stream.get("switched_s")
    over = int((lat > budget_ms).sum()) if budget_ms else 0
    return {
        "published": in_window / (window * fps),
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
        "late": stream["published_late"],
        "over_uncounted": max(0, over - stream["published_late"]),
        "first_s": first,
        "gpu_s": switched if switched is not None else stream.get("first_processed_s"),
        "frames": len(sent),
        "cpu_frames": stream.get("cpu_frames", 0),
        "first_cpu_s": stream.get("first_cpu_s"),
        "gaps": gaps(sent, fps=fps),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="inswapper_128", help="a swap network (stand-in weights), or classic")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--max-latency", default="33ms")
    ap.add_argument(
        "--input",
        default="demo",
        help="demo, a clip (played at its rate, looped), or faces:N (a 1080p clip of N real portraits drifting, made once)",
    )
    ap.add_argument("--fps", type=float, default=30.0, help="the input's frame rate (the camera's frames)")
    ap.add_argument("--size", default="", help="the demo's size, WxH (default: [capture]'s, 1280x720)")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--window", type=float, default=10.0, help="seconds after the first frame counted for 'published'")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", default="", help="a git ref to alternate with (e.g. main)")
    ap.add_argument("--extra", default="", help="more `vcam run` arguments, space-separated")
    ap.add_argument(
        "--evict", action="store_true", help="every start cold: the GPU libraries dropped from the page cache first (Linux)"
    )
    ap.add_argument(
        "--stalls",
        action="store_true",
        help="a thread keeps each GIL wait over 25 ms, each stop of the frame loop over 40 ms, and where the others stood",
    )
    ap.add_argument(
        "--also-env",
        action="append",
        default=[],
        help="KEY=VALUE (or several, space-separated): this tree again with them set, alternated",
    )
    ap.add_argument(
        "--prime", action="store_true", help="one unmeasured start of each tree first (a fresh machine's first-start costs)"
    )
    ap.add_argument("--prime-seconds", type=float, default=8.0, help="how long a primed start runs (its load must end)")
    ap.add_argument("--phases", action="store_true", help="run `vcam -v` and keep the load's phase lines in the JSON")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    from benchmarks.startup import standin_swapper
    from vcam.config import Duration
    from vcam.platform import folders

    here = Path(__file__).resolve().parents[1]
    work = folders.cache_dir() / "bench" / "first_seconds"
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "config.toml"
    size = ""
    if args.size:
        w, h = args.size.lower().split("x")
        size = f"[capture]\nwidth = {int(w)}\nheight = {int(h)}\n"
    models = ""  # benchmarks.startup's stand-ins, shared (a swap network's: 554 MB, written once)
    if args.model != "classic":
        models = f"[models]\ndir = '{standin_swapper().parent}'\n"
    cfg.write_text(models + size)
    face = here / "vcam" / "assets" / "grace_hopper.jpg"
    source = args.input
    if source.startswith("faces:"):  # the table names the input as given
        source = str(_faces_clip(work, int(source.split(":", 1)[1])))
    cmd = ["-v"] if args.phases else []  # the load's phase lines
    cmd += ["run", "-c", str(cfg), "--device", args.device, "--realtime", "--quiet", "--panel", "off"]
    cmd += ["--duration", f"{args.duration}s", "--max-latency", args.max_latency, "--face", str(face)]
    if args.model != "classic":
        cmd += ["--model", args.model]
    cmd += ["--fp16"] if args.fp16 else []
    if args.streams == 1:
        cmd += ["--input", source, "--output", "null"]
    else:
        cmd += [x for i in range(args.streams) for x in ("--stream", f"{source}=null,name=s{i}")]
    cmd += args.extra.split()
    budget_ms = float(Duration.parse(args.max_latency)) * 1000.0
    trees: dict[str, tuple[Path, dict[str, str]]] = {"this": (here, {})}
    if args.baseline:
        trees[args.baseline] = (_worktree(args.baseline), {})
    for pairs in args.also_env:  # "K=V" or "K1=V1 K2=V2": one more tree, its variables set together
        trees[f"this {pairs}"] = (here, env_pairs(pairs))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    if args.prime:  # a fresh machine's first starts pay what no later one does: none of it on one tree
        for name, (tree, extra_env) in trees.items():
            primed = list(cmd)
            # long enough for a first start's load to end (4 s may stop one inside it, and the swap
            # network's saved build is never written: each measured start parses the graph again)
            primed[primed.index("--duration") + 1] = f"{args.prime_seconds:g}s"
            got = _one(tree, primed, timeout=300, extra_env=extra_env)
            print(f"primed {name}: rc {got['rc']}", flush=True)
    for i in range(args.runs):
        order = list(trees.items())
        for name, (tree, extra_env) in order if i % 2 == 0 else order[::-1]:  # ABBA: no tree always first
            left_mb = _evict() if args.evict else None
            got = _one(tree, cmd, timeout=args.duration + 300, stalls=args.stalls, extra_env=extra_env)
            rows = [measure(s, fps=args.fps, window=args.window, budget_ms=budget_ms) for s in got["streams"].values()]
            run = {
                "seq": sum(map(len, runs.values())),  # the order the starts ran in
                "rc": got["rc"],
                "rows": rows,
                "tail": got["tail"] if got["rc"] or not rows else "",
                "evicted_left_mb": left_mb,
                # a run meant to load compiled engines that did not (issue 39: four streams' rows
                # "with a compiled cache" ran uncompiled for a day): said on the run's line
                "uncompiled": [ln.split(": ", 2)[-1][:80] for ln in got["log"].splitlines() if "running uncompiled" in ln],
            }
            if args.stalls:
                run["stalls"], run["gc"], run["blocks"] = got["stalls"], got["gc"], got["blocks"]
                for c in got["gc"]:  # the garbage collector's full passes hold the GIL from start to end
                    print(f"  gc: generation {c['generation']} {c['ms']:.0f} ms at {c['at_s']:.2f} s ({c['thread']})", flush=True)
                for st in got["stalls"][:: max(1, len(got["stalls"]) // 12)][:12]:
                    load = {k: v for k, v in st["where"].items() if v and k != "MainThread"}
                    print(f"  GIL wait {st['ms']:.0f} ms at {st['at_s']:.2f} s: {load}", flush=True)
                for b in sorted(got["blocks"], key=lambda b: -(b["ms"] or 0))[:12]:
                    print(
                        f"  frame loop blocked {b['ms'] or 0:.0f} ms at {b['at_s']:.2f} s: {b['where'].get('MainThread')}",
                        flush=True,
                    )
            if args.phases:
                run["phases"] = phase_lines(got["log"])
            runs[name].append(run)
            brief = (
                ", ".join(
                    f"{r['published']:.0%} p99 {r['p99_ms'] or 0:.0f} ms GPU {r['gpu_s'] or 0:.1f} s"
                    + (f" (longest pause {r['gaps'][0][1]:.0f} ms at {r['gaps'][0][0]:.1f} s)" if r["gaps"] else "")
                    for r in rows
                )
                or got["tail"][-300:]
            )
            unc = " [uncompiled: " + "; ".join(run["uncompiled"]) + "]" if run["uncompiled"] else ""
            run["load_done_s"] = load_done_s(got["log"])
            done = f" [load done {run['load_done_s']:.2f} s]" if run["load_done_s"] is not None else ""
            print(f"run {i + 1} {name}: rc {got['rc']}: {brief}{done}{unc}", flush=True)
    _table(runs, args, budget_ms)
    if args.json:
        Path(args.json).write_text(json.dumps({"cmd": cmd, "date": time.strftime("%Y-%m-%d %H:%M"), "runs": runs}, indent=2))
    return 0


def _table(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, budget_ms: float) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"first seconds: {args.model}{' fp16' if args.fp16 else ''} on {args.device}, {args.streams} stream(s) of "
        f"{args.input}, budget {budget_ms:.0f} ms, {args.duration:.0f} s, median of {args.runs} runs (every stream)"
    )
    t = Table(title=title)
    cols = (
        "tree",
        f"published {args.window:.0f} s",
        "p99 ms",
        "late / over uncounted",
        "first s",
        "swapped s",
        "CPU frames",
        "CPU s to 1st swapped",
    )
    for col in cols:
        t.add_column(col, justify="right", no_wrap=col == "tree")  # a tree's name on one line
    for name, rs in runs.items():
        rows = [r for run in rs for r in run["rows"]]
        if not rows:
            t.add_row(name, "failed", "", "", "", "", "", "")
            continue

        def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
            vals = [r[key] for r in rows if r[key] is not None]
            return statistics.median(vals) if vals else float("nan")

        t.add_row(
            name, f"{med('published'):.0%}", f"{med('p99_ms'):.0f}", f"{med('late'):.0f} / {med('over_uncounted'):.0f}",
            f"{med('first_s'):.2f}", f"{med('gpu_s'):.2f}", f"{med('cpu_frames'):.0f}", f"{med('first_cpu_s'):.2f}",
        )  # fmt: skip
    Console(width=140).print(t)


if __name__ == "__main__":
    sys.exit(main())
