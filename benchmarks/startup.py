"""Start-up benchmark: how long `vcam run` takes to publish its first frame, as a user starts it.

    python -m benchmarks.startup [--device cuda] [--runs 3] [--json OUT] [--before DIR] [--profile OUT.prof]

Each configuration is started ``--runs`` times in a fresh process (`vcam run --input demo --output
null --frames 1`): the first run may fill caches (CuPy's kernel cache, the model lock file), the
later ones are the warm start a user sees every day. The wall time covers the whole process (the
interpreter, imports, models, warm-up, one frame, shutdown), so it is an upper bound of the time to
the first published frame; newer vcam also says when its first frame was published ("first frame
X s after start", from the process start time), shown in its own column. With early frames
(``[pipeline] early_frames``) that first frame is the camera, pixelated by default, published while
the models load; the next column is when the first frame went through the pipeline (``--frames 1``
counts pipeline frames, so the wall time always includes loading the models). Configurations: the
built-in classic swapper, and inswapper_128 (the full-size stand-in, the real architecture with
random weights) with the recogniser in FP16 on CUDA. On CUDA the first frames are swapped on the CPU
while the GPU loads (``early_frames = "swap"``, :mod:`vcam.runtime.early_swap`: the classic swap on
NumPy, the inswapper on onnxruntime's CPU engine), so a ``--frames 1`` start ends on the CPU; the
rows "... to the GPU" run 12 s and read when the daemon switched to the GPU ("on cuda from X s";
a checkout without the early swap: its first frame through the pipeline), the column "on the GPU s".
``--before DIR``: the same runs with another checkout's ``vcam`` (a baseline measured in the same
session; each checkout keeps its own engine cache, ``engines/`` in it). ``--profile``: a cProfile of
one warm inswapper start (the main thread only: the models load in a thread). ``--phases``: the
daemon's own INFO lines of the last start of each configuration (``vcam -v``: where the load's time
went, what was captured in the background), printed and kept in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _models(root: Path) -> Path:
    """A models dir with the full-size inswapper and recogniser stand-ins (built once)."""
    from vcam.models import registry, standin
    from vcam.models.download import crc32_text

    root.mkdir(parents=True, exist_ok=True)
    written = False
    for name in ("inswapper_128", "arcface_w600k_r50"):
        spec = registry.get(name)
        path = root / spec.file
        if not path.is_file():
            standin.write(name, path)
            (root / spec.hash_file).write_text(crc32_text(path.read_bytes()))
            written = True
    if written:
        _pull(root)
    return root


def _pull(root: Path) -> None:
    """What a user's ``vcam models pull inswapper_128`` leaves beside the files (each verified and
    locked; on a GPU machine the swap network's build for PyTorch written), through the real command,
    once after the stand-ins are written: a fresh machine's first start is a user's after a pull."""
    cfg = root / "pull.toml"
    cfg.write_text(f"[models]\ndir = '{root.as_posix()}'\n")
    cmd = [sys.executable, "-m", "vcam", "models", "pull", "inswapper_128", "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "VCAM_CONFIG": str(cfg)}, timeout=600)
    if r.returncode:
        print(f"warning: `vcam models pull` of the stand-ins failed (rc {r.returncode}): {r.stdout[-300:]}{r.stderr[-300:]}")


def standin_swapper() -> Path:
    """The full-size inswapper stand-in the benchmarks share (in the cache dir, built once)."""
    from vcam.platform import folders

    return _models(folders.cache_dir() / "bench" / "startup" / "models") / "inswapper_128.onnx"


PHASE_WORDS = (
    "start-up:", "models loaded in", "in the background", "native build", "first frame", "compiled engine",
    "swapping on the CPU", "switched to",
)  # fmt: skip


def _start(
    args: list[str], env: dict, cwd: Path, profile: Path | None = None, phases: bool = False
) -> tuple[float, int, str, list[str]]:
    cmd = [sys.executable] + (["-m", "cProfile", "-o", str(profile)] if profile else []) + ["-m", "vcam"]
    cmd += (["-v"] if phases else []) + args
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    text = (r.stdout + r.stderr).strip()
    lines = [ln.strip()[:300] for ln in text.splitlines() if any(w in ln for w in PHASE_WORDS)] if phases else []
    return time.perf_counter() - t0, r.returncode, text[-1500:], lines


def _first_frame(text: str) -> float | None:
    """The daemon's own "first frame X s after start" (newer vcam), else None."""
    import re

    m = re.search(r"first frame ([\d.]+) s after start", text)
    return float(m.group(1)) if m else None


def _first_processed(text: str) -> float | None:
    """When the first frame went through the pipeline ("through the pipeline X s", when frames were
    published unswapped before: early frames); else the first frame's time."""
    import re

    m = re.search(r"through the pipeline ([\d.]+) s", text)
    return float(m.group(1)) if m else _first_frame(text)


def _on_gpu(text: str) -> float | None:
    """When the frames went through the GPU: the early swap's switch ("on cuda from X s"), else the
    first frame through the pipeline (no early swap)."""
    import re

    m = re.search(r"on cuda from ([\d.]+) s", text)
    return float(m.group(1)) if m else _first_processed(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--before", default="", help="another checkout to time the same way (a baseline)")
    ap.add_argument("--profile", default="", help="write a cProfile of one warm inswapper start here")
    ap.add_argument("--phases", action="store_true", help="run vcam -v and keep its start-up lines (last start)")
    ap.add_argument("--torch", action="store_true", help="also inswapper_128 on the torch backend (CPU default: onnxruntime)")
    ap.add_argument(
        "--early-threads", default="", help="also the inswapper's GPU switch with the CPU assembly on N threads a call (N,M,...)"
    )
    ap.add_argument("--only", default="", help="only the configurations whose name contains this")
    args = ap.parse_args()
    from vcam.platform import folders

    work = folders.cache_dir() / "bench" / "startup"
    models = _models(work / "models")
    face = Path(__file__).resolve().parents[1] / "vcam" / "assets" / "grace_hopper.jpg"
    cfg = work / "config.toml"
    cfg.write_text(f"[models]\ndir = '{models}'\n")
    base = ["run", "-c", str(cfg), "--device", args.device, "--input", "demo", "--output", "null", "--frames", "1", "--quiet"]
    configs = {
        "classic": base,
        "inswapper_128 fp16": base + ["--model", "inswapper_128", "--fp16", "--face", str(face)],
    }
    if args.device == "cuda":  # long enough to switch from the CPU to the GPU (the frames count from the CPU's first)
        at = base.index("--frames")
        configs["classic to the GPU"] = base[:at] + base[at + 2 :] + ["--duration", "12s"]
        configs["inswapper_128 fp16 to the GPU"] = configs["classic to the GPU"] + configs["inswapper_128 fp16"][len(base) :]
    if args.torch:
        configs["inswapper_128 torch"] = configs["inswapper_128 fp16"] + ["--backend", "torch"]
    extra_env: dict[str, dict[str, str]] = {}  # config -> environment (vcam.runtime.early_swap's overrides)
    for n in filter(None, args.early_threads.split(",")):
        label = f"inswapper_128 fp16 to the GPU, {n} early threads"
        configs[label], extra_env[label] = configs["inswapper_128 fp16 to the GPU"], {"VCAM_EARLY_THREADS": n}
    configs = {k: v for k, v in configs.items() if args.only in k}
    here = Path(__file__).resolve().parents[1]
    trees = {"now": here}
    if args.before:  # alternated run by run, the new code first (its first start meets the coldest caches)
        trees["before"] = Path(args.before).resolve()
    envs = {
        tree: dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p))
        for tree, root in trees.items()
    }
    rows: dict[tuple[str, str], dict[str, Any]] = {
        (tree, label): {
            "tree": tree,
            "config": label,
            "seconds": [],
            "first_frame_s": [],
            "first_processed_s": [],
            "on_gpu_s": [],
            "phases": [],
        }  # fmt: skip
        for tree in trees
        for label in configs
    }
    failed: set[tuple[str, str]] = set()
    for i in range(args.runs):
        for label, cmd in configs.items():
            for tree, root in trees.items():
                if (tree, label) in failed or (tree != "now" and label in extra_env):  # variants of this tree's code
                    continue
                env = dict(envs[tree], **extra_env.get(label, {}))
                secs, rc, text, lines = _start(cmd, env, root, phases=args.phases)
                if rc != 0:
                    print(f"{tree} {label}: rc={rc}: {text}", flush=True)
                    failed.add((tree, label))
                    continue
                row = rows[(tree, label)]
                row["seconds"].append(round(secs, 2))
                row["first_frame_s"].append(_first_frame(text))
                row["first_processed_s"].append(_first_processed(text))
                row["on_gpu_s"].append(_on_gpu(text) if args.device == "cuda" else None)
                row["phases"] = lines
                print(f"run {i + 1} {tree:7s} {label:20s} {secs:6.2f}s", flush=True)
                for ln in lines:
                    print(f"        {ln}", flush=True)
    if args.profile and "inswapper_128 fp16" in configs:
        path = os.pathsep.join(p for p in (str(here), os.environ.get("PYTHONPATH", "")) if p)
        _start(configs["inswapper_128 fp16"], dict(os.environ, PYTHONPATH=path), here, Path(args.profile), phases=False)
        import pstats

        if Path(args.profile).is_file():
            pstats.Stats(args.profile).sort_stats("cumulative").print_stats(30)
        else:  # a run that ends on the CPU assembly leaves with os._exit (the GPU load still running): no profile
            print(f"no profile written to {args.profile} (the run ended before its GPU load)")
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"vcam run to the first frame ({args.device}, {args.runs} starts each; first = caches filled)")
    cols = (
        "code",
        "config",
        "first start s",
        "warm start s (best)",
        "first frame s (daemon)",
        "through the pipeline s",
        "on the GPU s",
    )
    for col in cols:
        t.add_column(col, justify="right")
    for r in rows.values():
        if not r["seconds"] and (r["tree"], r["config"]) not in failed:  # not run (a variant of the other code)
            continue
        s = r["seconds"]
        ff = [f for f in r["first_frame_s"] if f is not None]
        fp = [f for f in r.get("first_processed_s", []) if f is not None]
        og = [f for f in r.get("on_gpu_s", []) if f is not None]
        t.add_row(
            r["tree"],
            r["config"],
            f"{s[0]:.2f}" if s else "failed",
            f"{min(s[1:] or s):.2f}" if s else "",
            ", ".join(f"{f:.1f}" for f in ff) or "-",
            ", ".join(f"{f:.1f}" for f in fp) or "-",
            ", ".join(f"{f:.1f}" for f in og) or "-",
        )
    Console(width=120).print(t)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": args.device, "date": time.strftime("%Y-%m-%d"), "rows": list(rows.values())}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
